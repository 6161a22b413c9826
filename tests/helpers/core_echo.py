"""A spawned process that sends back every object it receives, for the step-record
round-trip test (tests/server/test_step_records.py). A plain module on sys.path:
a spawned process imports its target by name."""


def echo(conn) -> None:
    try:
        while True:
            conn.send(conn.recv())
    except EOFError:
        pass
