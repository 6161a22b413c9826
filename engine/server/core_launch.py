"""Starting the engine core's process before its engine is known, so that its imports (torch
and the model code, ~1.4 s of a ~2.5 s start) run while `pagedkube serve` is still building its
parsers, reading its flags and importing the HTTP stack (docs/benchmarks.md "Start-up").

    launch = early_start(argv)          # pagedkube.cli, first thing for `pagedkube serve`
    ...                                 # flags parsed, config built and checked
    conn, worker = launch.serve(factory, log_level)
    launch.cancel()                     # or: the flags were bad, or --engine-in-process

This module imports only the standard library: it runs before anything else is imported.
It is the one way a core process starts (engine_core.spawn_core starts one and serves it at
once): "spawn", a pipe, dying with this thread; until it is given its factory it only imports,
and it exits on EOF.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Callable

# What the preloading core imports before it knows its engine: the modules every engine build
# imports first (torch with them).
PRELOAD_MODULES = ("pagedkube.engine.server.engine_core", "pagedkube.engine.llm_engine",
                   "pagedkube.engine.model_runner")


def early_start(argv: list[str]) -> CoreLaunch | None:
    """`pagedkube serve ...` (argv), before its flags are parsed: the core's process, unless the
    engine runs in-process or only --help is wanted (pagedkube/cli.py EARLY_STARTS)."""
    if any(a in ("-h", "--help", "--engine-in-process") for a in argv):
        return None
    return CoreLaunch.start()


class CoreLaunch:
    def __init__(self, conn: Connection, worker: BaseProcess):
        self.conn, self.worker = conn, worker
        self.serving = False

    @classmethod
    def start(cls) -> CoreLaunch:
        """Starts the process. Call it from the thread that will run the event loop
        (PR_SET_PDEATHSIG follows the creating thread)."""
        ctx = multiprocessing.get_context("spawn")
        conn, child = ctx.Pipe(duplex=True)
        worker = ctx.Process(target=run_preloaded_core, name="engine-core", daemon=True,
                             args=(child, os.getpid()))
        worker.start()
        child.close()
        return cls(conn, worker)

    def serve(self, factory: Callable[..., Any], log_level: int) -> tuple[Connection, BaseProcess]:
        """Gives the process its engine; (this end of its pipe, the process), as spawn_core returns."""
        self.conn.send((factory, log_level))
        self.serving = True
        return self.conn, self.worker

    def cancel(self) -> None:
        """Ends the process unless it was given its engine (EOF on its pipe: it exits once its
        imports are done, or at once by SIGKILL when this thread ends first)."""
        if not self.serving:
            self.conn.close()


def run_preloaded_core(conn: Connection, parent_pid: int) -> None:
    """The core process's entry point ("spawn" target): dies with the HTTP process and ignores
    SIGINT/SIGTERM (that process decides when it stops), imports, then waits for (factory, log
    level) and serves it."""
    from importlib import import_module

    from pagedkube.parent_death import die_with_parent

    die_with_parent(signal.SIGKILL, parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for name in PRELOAD_MODULES:
        import_module(name)
    try:
        factory, log_level = conn.recv()
    except (EOFError, OSError):          # cancelled: a bad flag, or the engine runs in-process
        return
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s [core]: %(message)s")
    from pagedkube.engine.server.engine_core import serve_core

    serve_core(conn, factory)
