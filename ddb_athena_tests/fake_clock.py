"""A clock the test moves: `clock()` reads it, `clock.sleep(s)` moves it on."""


class FakeClock:
    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
