"""The check-and-verdict scaffolding of the ops tests (startup, metrics_scrape, haproxy_scaleout,
logs, reflection, response_size): each check prints `ok   what` or `FAIL what` and the failures are
kept; verdict() prints the summary line and returns the test's exit code (0 all passed, 1 not)."""


class Checks:
    def __init__(self):
        self.failures = []

    def __call__(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            self.failures.append(what)

    def verdict(self):
        if self.failures:
            print(f"{len(self.failures)} check(s) failed")
            return 1
        print("all checks passed")
        return 0
