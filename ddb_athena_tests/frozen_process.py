"""A writer in a process of its own that a test freezes (SIGSTOP to its process group: its Python and its JVM) and
resumes, started once and given one job after another as lines on its standard input: a process and its JVM take
15-20 s to start and to warm up, so the variants of a test share one. A variant that fails kills it, whatever state it
leaves it in; the next starts another."""

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

# How long a test waits for a line of the process (its start, its JVM's included, or the end of its job).
ANSWER_SECONDS = 300


class FrozenProcess:
    def __init__(self, script: str):
        self.script, self.process, self.lines = script, None, queue.Queue()

    @contextmanager
    def serving(self, job: str, args: Sequence[str] = ()) -> Iterator["FrozenProcess"]:
        """The process (started with `args` if none runs) given `job`, a line, for the block."""
        try:
            if self.process is None or self.process.poll() is not None:
                self._start(args)
            self._say(job)
            yield self
        except BaseException:
            self.kill()
            raise

    def _start(self, args: Sequence[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", self.script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its JVM in its process group: one signal freezes both
        )
        # Read by a thread, so that a process that never answers fails its test instead of hanging it.
        self.lines = queue.Queue()
        threading.Thread(target=self._forward, args=(self.process.stdout, self.lines), daemon=True).start()

    @staticmethod
    def _forward(output, lines: queue.Queue) -> None:
        for line in output:
            lines.put(line)
        lines.put(None)  # it ended

    def line(self, seen: Sequence[str] = ()) -> str:
        """Its next line; fails if it ended instead (with the last of the lines `seen` before)."""
        line = self.lines.get(timeout=ANSWER_SECONDS)
        assert line is not None, f"the process ended (exit status {self.process.wait()}) after: {list(seen)[-20:]}"
        return line.strip()

    def wait_for(self, wanted: str) -> list[str]:
        """The lines before `wanted`."""
        seen = []
        while (line := self.line(seen)) != wanted:
            seen.append(line)
        return seen

    def freeze(self) -> None:
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)
        self._say("go on")

    def _say(self, line: str) -> None:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        """Its input closed, it ends after its last job."""
        if self.process is not None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=60)
            finally:
                self.kill()
