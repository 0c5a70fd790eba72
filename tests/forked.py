"""Run a function in a child made by ``fork`` (as gunicorn --preload and Celery prefork make
their workers) and return what it returned; a hang or an exception fails the test."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any


def run_in_forked_child(fn: Callable[[], Any], timeout: float = 60.0) -> Any:
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def target() -> None:
        try:
            send.send(("ok", fn()))
        except BaseException as exc:  # reported to the parent as text
            send.send(("error", f"{type(exc).__name__}: {exc}"))

    process = ctx.Process(target=target)
    process.start()
    try:
        if not receive.poll(timeout):
            raise AssertionError(f"the forked child gave no answer within {timeout:.0f} s")
        status, value = receive.recv()
    finally:
        process.join(5)
        if process.is_alive():
            process.kill()
    assert status == "ok", value
    return value
