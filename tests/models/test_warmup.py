"""The warm-up's demonstrator: label noise and the cache key."""

import re

from relax.config import load_config
from relax.models.tokenizer import CharTokenizer
from relax.models.warmup import text_batches, warmup_key
from relax.tasks import make_task, supervised_pairs

BASE = ["warmup.steps=4", "warmup.batch_size=16", "task.size=64"]


def _targets(overrides: list[str]) -> tuple[list[int], list[int]]:
    """(the task's answers, the warm-up's targets) of the config's first warm-up rows, as integers."""
    cfg = load_config("experiments/async/cpu.yaml", BASE + overrides)
    tok = CharTokenizer()
    pairs = supervised_pairs(make_task(cfg.task, cfg.seed, "train"), cfg.warmup.steps * cfg.warmup.batch_size)
    got = []
    for packed, _ in text_batches(tok, cfg):
        for row, mask in zip(packed.resp_ids, packed.mask):
            text = tok.decode([int(t) for t, m in zip(row, mask) if m > 0])
            got.append(int(re.sub(r"[^0-9-]", "", text)))
    return [int(a.strip()) for _, a in pairs], got


def test_one_offset_moves_every_noisy_answer_by_it_and_no_noise_keeps_them():
    answers, clean = _targets([])
    assert clean == answers
    answers, noisy = _targets(["warmup.label_noise=0.6", "warmup.label_noise_offsets=[1]"])
    moved = [g - a for a, g in zip(answers, noisy)]
    assert set(moved) == {0, 1}  # only ever one too high
    assert 0.4 < sum(moved) / len(moved) < 0.8  # about 60% of 64 rows


def test_default_offsets_spread_the_noise():
    answers, noisy = _targets(["warmup.label_noise=1.0"])
    assert {g - a for a, g in zip(answers, noisy)} == {-2, -1, 1, 2}


def test_an_unset_knob_keeps_the_cache_key_a_set_one_changes_it():
    base = load_config("experiments/async/cpu.yaml", [])
    same = load_config("experiments/async/cpu.yaml", ["warmup.label_noise_offsets=null"])
    other = load_config("experiments/async/cpu.yaml", ["warmup.label_noise_offsets=[1]"])
    assert warmup_key(base) == warmup_key(same) != warmup_key(other)


def test_the_omni_warm_up_has_the_same_demonstrator():
    """Omni batches (media + text) take label noise too: with one offset every noisy target is one too high,
    and the rows drawn (their media) are the same with and without the noise."""
    from relax.omni.train import warmup_batches
    from relax.omni.tokenizer import OmniTokenizer

    def targets(overrides):
        cfg = load_config("experiments/omni/cpu.yaml", ["warmup.steps=2", "warmup.batch_size=16", "task.size=64",
                                                        *overrides])
        tok, out, media = OmniTokenizer(), [], []
        for packed, m in warmup_batches(tok, cfg):
            media += [sorted(x) for x in m] if m else []
            out += [int(tok.decode([int(t) for t, k in zip(row, mask) if k > 0]).strip())
                    for row, mask in zip(packed.resp_ids, packed.mask)]
        return out, media

    clean, media_clean = targets(["warmup.label_noise=0"])
    noisy, media_noisy = targets(["warmup.label_noise=0.6", "warmup.label_noise_offsets=[1]"])
    moved = [b - a for a, b in zip(clean, noisy)]
    assert set(moved) == {0, 1} and 0.35 < sum(moved) / len(moved) < 0.85
    assert media_clean == media_noisy
