"""Generated token ids -> the text a client sees: incremental decoding (a character split over
two tokens waits for its second half), special tokens left out, and stop strings (the text
ends just before the first one; while streaming, the last few characters are held back until
they cannot be the start of a stop string)."""
from __future__ import annotations


class TextOut:
    def __init__(self, tokenizer, stop=()):
        self._stream = tokenizer.stream(skip_special_tokens=True)
        self.stop = list(stop)
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self.text, self.emitted, self.n_tokens, self.stopped = "", 0, 0, False

    def feed(self, tokens) -> str:
        """Take new token ids; return the text that may be sent now."""
        for t in tokens:
            if self.stopped:
                break
            self.n_tokens += 1
            self.text += self._stream.step(t)
            hits = [i for i in (self.text.find(s) for s in self.stop) if i >= 0]
            if hits:
                self.text, self.stopped = self.text[:min(hits)], True
        end = len(self.text) if self.stopped else max(self.emitted, len(self.text) - self._hold)
        out, self.emitted = self.text[self.emitted:end], end
        return out

    def rest(self) -> str:
        """What is left to send once the request has finished."""
        out, self.emitted = self.text[self.emitted:], len(self.text)
        return out
