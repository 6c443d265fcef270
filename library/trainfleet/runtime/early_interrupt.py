"""Ctrl-C before the run's own handler takes over (``preemption.py``, at the start of ``fit``): a stop at once.

Python raises KeyboardInterrupt only when the main thread runs Python code, and the process-group rendezvous waits in
torch's C++ store for ranks that have not arrived, up to its timeout (30 minutes by default): Ctrl-C there did nothing
for that long. The signal's wakeup fd wakes a thread at once; when the main thread has not ended the process a second
later, the thread ends it with exit 130, as a shell reports a command Ctrl-C ended. Kept free of heavy imports:
``trainfleet/main.py`` installs it before importing torch.
"""

import os
import signal
import socket
import sys
import threading
import time

from trainfleet import program
from trainfleet.exit_codes import INTERRUPTED_EXIT_CODE

GRACE_S = 1.0  # for the main thread to stop by itself, where it runs Python code


class EarlyInterrupt:
    armed = False
    _writer: socket.socket | None = None
    _previous_fd = -1  # the wakeup fd set before (an asyncio loop's, in a notebook), put back by ``disarm``
    _fork_hook = False

    @classmethod
    def catch(cls) -> None:
        """From the command's first line, in every process of the run (forked ranks too), until ``disarm`` (at the
        end of ``main`` at the latest: a notebook's or pytest's own Ctrl-C is theirs again). SIGINT ignored (a
        background job, nohup) or handled by the caller stays as it is."""
        if (
            not cls.armed
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
            and threading.current_thread() is threading.main_thread()
        ):
            cls._previous_fd = cls._watch()
            if not cls._fork_hook:
                os.register_at_fork(after_in_child=cls._after_fork)
                cls._fork_hook = True

    @classmethod
    def disarm(cls) -> None:
        """The run's own handler has taken over (main thread): the watch ends."""
        if cls.armed:
            cls.armed = False
            signal.set_wakeup_fd(cls._previous_fd)
            cls._writer.close()  # the watching thread reads the end of the stream and ends

    @classmethod
    def _watch(cls) -> int:
        """Starts the watching thread; returns the wakeup fd it replaced."""
        reader, cls._writer = socket.socketpair()
        cls._writer.setblocking(False)
        previous = signal.set_wakeup_fd(cls._writer.fileno(), warn_on_full_buffer=False)
        cls.armed = True
        threading.Thread(target=cls._wait, args=(reader,), name="early-interrupt", daemon=True).start()
        return previous

    @classmethod
    def _wait(cls, reader: socket.socket) -> None:
        with reader:
            while data := reader.recv(64):  # one byte per signal: its number
                if signal.SIGINT in data and cls.armed:
                    time.sleep(GRACE_S)
                    if cls.armed:
                        # os.write: the main thread may hold sys.stderr's lock where it waits
                        message = f"Ctrl-C: process {os.getpid()} stopped at once, before training: nothing saved"
                        os.write(sys.stderr.fileno(), f"{program.prefix()} {message}\n".encode())
                        os._exit(INTERRUPTED_EXIT_CODE)

    @classmethod
    def _after_fork(cls) -> None:
        """A forked rank watches for itself (the parent's thread is not in the child); the parent's socket is closed
        here, not written to."""
        if cls.armed and threading.current_thread() is threading.main_thread():
            cls._writer.close()
            cls._watch()
