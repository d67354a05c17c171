"""A character-level tokenizer for the tiny models: printable ASCII plus pad/bos/eos.

Tiny random-init models learn arithmetic far faster over ~100 characters than over a 49k BPE vocabulary,
and sampling over 100 logits costs nothing. Pretrained models use their own Hugging Face tokenizer.
"""

from __future__ import annotations

PAD, BOS, EOS = 0, 1, 2
_OFFSET = 3  # first printable character id
_FIRST, _LAST = 32, 126  # ' ' .. '~'


class CharTokenizer:
    pad_token_id = PAD
    bos_token_id = BOS
    eos_token_id = EOS
    vocab_size = _OFFSET + (_LAST - _FIRST + 1)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        # Characters outside printable ASCII map to '?' rather than failing on odd data rows.
        ids = [(_OFFSET + ord(c) - _FIRST) if _FIRST <= ord(c) <= _LAST else _OFFSET + ord("?") - _FIRST for c in text]
        return [BOS, *ids] if add_bos else ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i < _OFFSET:
                if not skip_special_tokens:
                    out.append(("<pad>", "<s>", "</s>")[i])
                continue
            out.append(chr(i - _OFFSET + _FIRST))
        return "".join(out)
