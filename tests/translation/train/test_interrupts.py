"""The Ctrl-C guard on its own, with real SIGINTs to this process: stop at once inside the sections
that may be cut short, else wait for the next safe point; a second Ctrl-C stops at once; nothing is
installed where SIGINT is ignored (nohup) or off the main thread."""

import os
import signal
import threading
import time

import pytest

from tinyformer.translation.train.interrupts import InterruptGuard

pytestmark = pytest.mark.skipif(os.name != "posix", reason="SIGINT to a process is POSIX")


@pytest.fixture
def sigint(request):
    """SIGINT handled as given (Python's default unless parametrized) for the test, whatever the
    process had; restored afterwards."""
    old = signal.signal(signal.SIGINT, getattr(request, "param", signal.default_int_handler))
    yield
    signal.signal(signal.SIGINT, old)


def ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)  # the handler runs here


def test_outside_a_section_ctrl_c_waits_for_the_next_safe_point(sigint):
    guard = InterruptGuard()
    with guard.installed():
        assert signal.getsignal(signal.SIGINT) == guard._on_sigint
        ctrl_c()  # an update in progress: nothing is raised
        assert guard.pending and not guard.forced
        with pytest.raises(KeyboardInterrupt):
            guard.stop_if_asked()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_inside_a_section_that_may_be_cut_short_ctrl_c_stops_at_once(sigint):
    guard = InterruptGuard()
    with guard.installed():
        with pytest.raises(KeyboardInterrupt):
            with guard.cut_short_allowed():
                ctrl_c()
                pytest.fail("not interrupted")
        assert not guard.pending and not guard.forced
        guard.stop_if_asked()  # nothing waits
        ctrl_c()  # the section is over: noted again, not raised
        assert guard.pending


def test_a_section_starts_at_a_safe_point(sigint):
    guard = InterruptGuard()
    with guard.installed():
        ctrl_c()
        entered = []
        with pytest.raises(KeyboardInterrupt):
            with guard.cut_short_allowed():
                entered.append(True)
        assert not entered


def test_a_second_ctrl_c_while_one_waits_stops_at_once_and_is_forced(sigint):
    guard = InterruptGuard()
    with guard.installed():
        ctrl_c()
        with pytest.raises(KeyboardInterrupt):
            ctrl_c()
        assert guard.forced
        assert guard.stopping() is True


def test_while_stopping_any_ctrl_c_stops_at_once(sigint):
    guard = InterruptGuard()
    with guard.installed():
        with pytest.raises(KeyboardInterrupt):
            with guard.cut_short_allowed():
                ctrl_c()
        assert guard.stopping() is False  # the first Ctrl-C: saving may go ahead
        with pytest.raises(KeyboardInterrupt):  # ... unless another one comes
            ctrl_c()
        assert guard.forced


def test_the_default_handler_is_back_after_an_exception(sigint):
    guard = InterruptGuard()
    with pytest.raises(RuntimeError):
        with guard.installed():
            raise RuntimeError("the run failed")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("sigint", [signal.SIG_IGN], indirect=True)
def test_where_sigint_is_ignored_nothing_is_installed(sigint):
    """nohup: SIGINT stays ignored, so a stray Ctrl-C neither stops nor is noted."""
    guard = InterruptGuard()
    with guard.installed():
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        with guard.cut_short_allowed():
            ctrl_c()
    assert not guard.pending and signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_off_the_main_thread_nothing_is_installed(sigint):
    seen, errors = [], []

    def train():
        try:
            with InterruptGuard().installed():
                seen.append(signal.getsignal(signal.SIGINT))
        except Exception as error:  # signal.signal would raise ValueError here
            errors.append(error)

    thread = threading.Thread(target=train)
    thread.start()
    thread.join()
    assert errors == [] and seen == [signal.default_int_handler]
