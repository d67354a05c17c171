"""Omni data path: processors, bus round trip of every modality, text-only roles see no media, tiny omni model."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from relax.bus.batch import from_tensordict, to_tensordict
from relax.omni.media import SR, digits, dtmf, read_video, write_video
from relax.omni.processor import FIELDS, N_MELS, OmniProcessor, image_patches, log_mel
from relax.omni.tokenizer import OmniTokenizer

TOK = OmniTokenizer()


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    img, labels = digits()
    path = write_video(tmp_path_factory.mktemp("vid") / "d.mp4", img[7], dtmf(4, 1))
    return path, int(labels[7])


@pytest.fixture(scope="module")
def rows(video):
    proc = OmniProcessor(TOK)
    return proc.rows([
        {"media": {"image": "digits://3", "audio": "dtmf://5/11"}, "text": " sum="},
        {"media": {"video": str(video[0])}, "text": " sum="},
        {"media": {}, "text": " text only"},
    ])


def test_processor_features(rows, video):
    img, _ = digits()
    assert rows["image_patches"][0].shape == (4, 16)
    assert torch.allclose(rows["image_patches"][0][0], torch.as_tensor(img[3][:4, :4]).reshape(-1) / 16)
    assert rows["audio_mel"][0].shape[1] == N_MELS and rows["audio_mel"][1].shape[0] > 0  # video soundtrack
    assert rows["video_frames"][1].shape == (4, 8, 8) and rows["video_frames"][0].shape[0] == 0
    assert all(rows[f][2].shape[0] == 0 for f in FIELDS)
    # media travel by reference: the row names the file / URI, the bytes stay where they are
    assert rows["media_uri"][1] == f"video={video[0]}" and rows["media_uri"][0] == "audio=dtmf://5/11|image=digits://3"
    ids = rows["prompt_ids"][1].tolist()
    assert ids.count(TOK.VIDEO) == 16 and ids.count(TOK.AUDIO) == 4 and TOK.decode(ids) == " sum="


def test_video_decodes_to_its_digit_and_tone(video):
    path, label = video
    frames, audio = read_video(path)
    img, labels = digits()
    assert np.abs(frames[0] - img[7]).mean() < 1.0  # lossy codec, same picture
    spec = np.abs(np.fft.rfft(audio[: int(0.3 * SR)]))
    freqs = np.fft.rfftfreq(int(0.3 * SR), 1 / SR)
    peaks = sorted(freqs[np.argsort(spec)[-40:]])
    assert any(abs(f - 770) < 30 for f in peaks) and any(abs(f - 1209) < 40 for f in peaks)  # DTMF '4'


def test_log_mel_and_patches():
    mel = log_mel(dtmf(1, 0))
    assert mel.shape == (31, N_MELS) and torch.isfinite(mel).all()
    assert image_patches(np.arange(64, dtype=np.float32).reshape(8, 8))[1, 0] == 4 / 16
    with pytest.raises(ValueError, match="8x8"):
        image_patches(np.zeros((4, 4)))


def test_every_modality_round_trips_the_bus_codec(rows):
    td = to_tensordict(rows)
    back = from_tensordict(td)
    for k, v in rows.items():
        if isinstance(v[0], torch.Tensor):
            assert all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) for a, b in zip(v, back[k])), k
        else:
            assert back[k] == v
    text = from_tensordict(td.select("prompt_ids", "media_uri"))
    assert set(text) == {"prompt_ids", "media_uri"}


def test_task_answers_are_exact(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAX_CACHE", str(tmp_path))
    from relax.omni.task import DigitSumTask

    t = DigitSumTask("train", size=8, video_every=4, n_videos=1)
    _, labels = digits()
    for i in range(8):
        it = t[i]
        if it.kind == "image_audio":
            img = int(it.media["image"].split("//")[1])
            b = int(it.media["audio"].split("//")[1].split("/")[0])
            assert img % 5 != 0 and it.answer == str(int(labels[img]) + b)
        else:
            assert it.media["video"].startswith(str(tmp_path))
    assert t.score(t[0], f" {t[0].answer} ") == 1.0 and t.score(t[0], "x") == 0.0
    e = DigitSumTask("eval", size=8, video_every=0)
    assert all(int(e[i].media["image"].split("//")[1]) % 5 == 0 for i in range(8))


def test_tiny_omni_generates_and_trains(rows):
    from pathlib import Path

    from relax.algorithms import LossScale
    from relax.config import load_config
    from relax.omni.model import OmniEngine, build_tiny_omni
    from relax.trainers import TorchTrainer

    model = build_tiny_omni(hidden_size=32, num_layers=1, intermediate_size=64)
    media = [{k: rows[k][i] for k in FIELDS} for i in range(3)]
    eng = OmniEngine(build_tiny_omni(hidden_size=32, num_layers=1, intermediate_size=64), TOK)
    gens = eng.generate([p.tolist() for p in rows["prompt_ids"]], 3, media=media)
    assert len(gens) == 3 and all(1 <= len(g.token_ids) <= 3 for g in gens)
    # the media change what the model predicts
    ids = rows["prompt_ids"][0][None]
    a = model(input_ids=ids, media=[media[0]]).logits
    b = model(input_ids=ids, media=[{**media[0], "image_patches": media[0]["image_patches"] + 1}]).logits
    assert not torch.allclose(a, b)
    with pytest.raises(ValueError, match="image_patches"):
        model(input_ids=ids, media=[{**media[0], "image_patches": media[0]["image_patches"][:2]}])
    # the engine's trainer (relax.trainers.TorchTrainer) trains the encoders through the media fields
    cfg = load_config(Path(__file__).resolve().parents[2] / "experiments/omni/cpu.yaml")
    resp = [torch.tensor(g.token_ids) for g in gens]
    lps = [torch.tensor(g.log_probs) for g in gens]
    batch = {**rows, "response_ids": resp, "rollout_log_probs": lps, "old_log_probs": lps,
             "advantages": [torch.full((len(r),), x) for r, x in zip(resp, (1.0, -1.0, 0.5))]}
    TorchTrainer(model, TOK.pad_token_id, cfg).accumulate(batch, LossScale(total_tokens=9, total_seqs=3))
    assert model.vision_proj.weight.grad.abs().sum() > 0 and model.audio_proj.weight.grad.abs().sum() > 0


# ---- the real bus (Ray + TransferQueue) ------------------------------------------------------------------
ray_mod = pytest.importorskip("ray")
ray_mod.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.mark.slow
def test_real_bus_fields_and_text_only_role(rows, local_ray):
    from relax.bus import Bus
    from relax.config import BusConfig

    bus = Bus.start(BusConfig(capacity_rows=16), group_size=3, max_staleness=1)
    try:
        put = {**rows, "sample_id": torch.arange(3), "group_id": torch.zeros(3, dtype=torch.long),
               "reward": torch.tensor([1.0, 0.0, 0.5])}
        bus.put_rows(0, put)
        text = bus.fetch(0, "reward_role", ["prompt_ids", "media_uri"], max_rows=3)
        assert text is not None and set(text.data) == {"prompt_ids", "media_uri"}  # no pixels, no audio, no video
        media = bus.fetch(0, "actor_train", ["prompt_ids", *FIELDS], max_rows=3)
        order = [put["media_uri"].index(u) for u in bus.fetch(0, "order", ["media_uri"], max_rows=3)["media_uri"]]
        for f in FIELDS:
            for got, i in zip(media[f], order):
                assert got.dtype == rows[f][i].dtype and torch.equal(got, rows[f][i]), f
    finally:
        bus.close()


def test_placeholders_are_never_emitted(rows):
    from relax.omni.model import build_tiny_omni

    model = build_tiny_omni(hidden_size=32, num_layers=1, intermediate_size=64)
    media = [{k: rows[k][0] for k in FIELDS}]
    logits = model(input_ids=rows["prompt_ids"][0][None], media=media).logits
    assert torch.isinf(logits[..., [TOK.IMAGE, TOK.AUDIO, TOK.VIDEO]]).all()
    assert torch.isfinite(logits[..., : TOK.IMAGE]).all()
