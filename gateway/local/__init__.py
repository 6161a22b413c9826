"""`pagedkube up`: the local stack (engine processes + the gateway in one supervisor).

    cli.py         the `up` subcommand (engine flags: engine/server/engine_flags.py)
    config.py      UpConfig
    supervisor.py  starts the engines and the gateway; Ctrl-C stops all
    engines.py     LocalEngines: engine processes, the local ScaleTarget
    restart.py     when an engine is restarted: back-off and health
    console.py     component-prefixed logs and one status line per component
"""
