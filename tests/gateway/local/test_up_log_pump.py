"""`pagedkube up` relays its engines' output line by line, whatever a line's length: a
real child process writes a 200 KB line (more than asyncio's 64 KiB readline limit, which
used to end the relay and leave the engine blocked on a full pipe) and keeps writing."""
from __future__ import annotations

import asyncio
import sys

from pagedkube.gateway.endpoints import EndpointSet
from pagedkube.gateway.local.engines import MAX_LOG_LINE_BYTES, LocalEngines

CHILD = "import sys; sys.stdout.write('first\\n' + 'x' * 200_000 + '\\nafter' * 3 + '\\nlast'); sys.stdout.flush()"


def test_long_lines_are_cut_and_the_relay_goes_on():
    lines: list[str] = []
    engines = LocalEngines(EndpointSet(), [], on_log=lambda name, line: lines.append(f"{name}:{line}"))

    async def run() -> int:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", CHILD, stdout=asyncio.subprocess.PIPE)
        await asyncio.wait_for(engines._pump("engine-0", proc), 60)
        return await proc.wait()

    assert asyncio.run(run()) == 0
    assert lines[0] == "engine-0:first"
    assert lines[1] == "engine-0:" + "x" * MAX_LOG_LINE_BYTES + " [...]"
    assert lines[2:] == ["engine-0:after"] * 3 + ["engine-0:last"]
