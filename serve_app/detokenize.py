"""Token ids -> text deltas for streaming, with OpenAI's stop-string semantics.

Text is decoded from all tokens so far (so merges across token boundaries come
out right) and only the new suffix is sent. Two things are held back until
they are certain: a trailing U+FFFD (the first bytes of a multi-byte character
whose rest is in the next token) and a tail that could still grow into a stop
string. When a stop string appears, the text is cut before it and the stream
ends; the stop string itself is never sent, as in OpenAI's API.
"""


class Detokenizer:
    def __init__(self, tokenizer, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.tokens: list[int] = []
        self.sent = 0  # characters of the text already sent
        self.stopped = False  # a stop string was found: nothing more is sent
        self._hold = max((len(s) for s in self.stop), default=1) - 1

    def push(self, tokens: list[int]) -> str:
        """The text that became certain with these new tokens."""
        if self.stopped:
            return ""
        self.tokens.extend(tokens)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        cut = self._stop_at(text)
        if cut is not None:
            self.stopped = True
            return self._emit(text[:cut])
        end = len(text) - self._hold
        while end > self.sent and text[end - 1] == "\ufffd":
            end -= 1
        return self._emit(text[:max(end, self.sent)])

    def finish(self) -> str:
        """Everything still held back, once the generation has ended."""
        if self.stopped:
            return ""
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        cut = self._stop_at(text)
        self.stopped = True
        return self._emit(text if cut is None else text[:cut])

    def _stop_at(self, text: str) -> int | None:
        # Search only where a stop string could newly appear: from just before what was already sent.
        start = max(0, self.sent - self._hold)
        hits = [i for s in self.stop if (i := text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def _emit(self, upto: str) -> str:
        delta = upto[self.sent:]
        self.sent = len(upto)
        return delta
