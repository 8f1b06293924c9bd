"""The progress bar over a run's steps (tqdm), or none; notes go above the bar or to ``echo``."""

__all__ = ["ProgressBar"]


class ProgressBar:
    def __init__(self, enabled, total, initial, echo):
        self.echo, self.bar = echo, None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

    def advance(self):
        if self.bar is not None:
            self.bar.update(1)

    def show(self, skipped=0, **values):
        """Set the bar's postfix to ``values`` (and the count of skipped updates, if any)."""
        if self.bar is not None:
            self.bar.set_postfix({**values, **({"skipped": skipped} if skipped else {})})

    def note(self, text):
        if self.bar is not None:
            self.bar.write(text)
        else:
            self.echo(text)

    def close(self):
        if self.bar is not None:
            self.bar.close()
