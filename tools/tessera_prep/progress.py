"""A plain-text progress line on stderr: documents (of total when known), tokens, tokens/s.

On a terminal the line is redrawn in place at most five times a second; when stderr is a file
or a pipe (CI logs) a full line is printed at most every ten seconds instead.
"""
import sys
import time

from . import LOG_PREFIX


def human(n):
    """1234567 -> '1.23M'."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}" if isinstance(n, float) else str(n)


class Progress:
    def __init__(self, total=None, stream=None, enabled=True):
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval = 0.2 if self.tty else 10.0
        self.start = time.monotonic()
        self.last = self.start
        self.documents = 0
        self.tokens = 0
        self.drawn = False

    def elapsed(self):
        return time.monotonic() - self.start

    def rate(self):
        return self.tokens / max(self.elapsed(), 1e-9)

    def update(self, documents=1, tokens=0):
        self.documents += documents
        self.tokens += tokens
        now = time.monotonic()
        if self.enabled and now - self.last >= self.interval:
            self.last = now
            self._draw()

    def _line(self):
        docs = f"{self.documents}/{self.total}" if self.total else f"{self.documents}"
        if self.total:
            docs += f" ({100.0 * self.documents / self.total:3.0f}%)"
        return (f"{LOG_PREFIX} documents {docs}  tokens {human(self.tokens)}  "
                f"{human(self.rate())} tokens/s  {self.elapsed():.1f}s")

    def _draw(self):
        if self.tty:
            self.stream.write("\r" + self._line() + "\x1b[K")
        else:
            self.stream.write(self._line() + "\n")
        self.stream.flush()
        self.drawn = True

    def close(self):
        """Draws the final state; on a terminal, ends the redrawn line."""
        if self.enabled and self.drawn:
            self._draw()
            if self.tty:
                self.stream.write("\n")
                self.stream.flush()
