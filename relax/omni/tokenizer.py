"""The char tokenizer plus three media placeholder tokens (one per feature token the encoders emit)."""

from __future__ import annotations

from relax.models.tokenizer import CharTokenizer


class OmniTokenizer(CharTokenizer):
    IMAGE = CharTokenizer.vocab_size
    AUDIO = CharTokenizer.vocab_size + 1
    VIDEO = CharTokenizer.vocab_size + 2
    vocab_size = CharTokenizer.vocab_size + 3
    MEDIA = {"image": IMAGE, "audio": AUDIO, "video": VIDEO}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        names = {self.IMAGE: "<image>", self.AUDIO: "<audio>", self.VIDEO: "<video>"}
        out = []
        for i in ids:
            i = int(i)
            if i in names:
                if not skip_special_tokens:
                    out.append(names[i])
                continue
            out.append(super().decode([i], skip_special_tokens))
        return "".join(out)
