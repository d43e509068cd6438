"""log_level: the process's first engine makes the module log to stderr at
its level. Each case runs in a process of its own (what a process logs is
decided once), and the test reads that process's stderr."""

import json
import os
import subprocess
import sys

from helpers import CONFIG


def stderr_of(*levels, tent_log=None):
    """Start and close one engine per level, in order, in a fresh process."""
    configs = [json.dumps({**json.loads(CONFIG), "log_level": level}) for level in levels]
    script = (
        "import sys, tent\n"
        "for c in sys.argv[1:]:\n"
        "    tent.TransferEngine(c).close()\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TENT_LOG", "TENT_CONF")}
    if tent_log is not None:
        env["TENT_LOG"] = tent_log
    out = subprocess.run(
        [sys.executable, "-c", script, *configs],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    return out.stderr


def lines_at(stderr, level):
    return [l for l in stderr.splitlines() if l.split()[1:2] == [level]]


def test_engine_logs_at_its_log_level_to_stderr():
    debug = stderr_of("debug")
    assert any("worker started" in l for l in lines_at(debug, "DEBUG")), debug
    warn = stderr_of("warn")
    assert not lines_at(warn, "DEBUG") and not lines_at(warn, "INFO"), warn


def test_log_level_is_the_first_engine_s_and_tent_log_overrides_it():
    two = stderr_of("warn", "debug")
    assert not lines_at(two, "DEBUG"), two
    assert any("log_level applies per process" in l for l in lines_at(two, "WARN")), two
    assert lines_at(stderr_of("error", tent_log="debug"), "DEBUG")


def reload_stderr(first, then, tent_log=None):
    """Start one engine at `first`'s log_level, reload it with `then`'s
    configuration (a dict merged over CONFIG), in a fresh process; the
    reload's outcome (printed) and stderr."""
    base = json.loads(CONFIG)
    script = (
        "import sys, tent\n"
        "e = tent.TransferEngine(sys.argv[1])\n"
        "try:\n"
        "    print('generation', e.reload(sys.argv[2]))\n"
        "except tent.InvalidArgumentError as x:\n"
        "    print('refused', x)\n"
        "e.close()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TENT_LOG", "TENT_CONF")}
    if tent_log is not None:
        env["TENT_LOG"] = tent_log
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps({**base, "log_level": first}),
         json.dumps({**base, **then})],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout, out.stderr


def test_reload_sets_the_process_log_level_unless_tent_log_decides():
    said, err = reload_stderr("warn", {"log_level": "info"})
    assert said.strip() == "generation 2", said + err
    assert any("configuration reloaded" in l for l in lines_at(err, "INFO")), err
    said, err = reload_stderr("warn", {"log_level": "info"}, tent_log="warn")
    assert said.startswith("refused") and "log_level cannot change here" in said, said
    assert "TENT_LOG" in said, said
    said, _ = reload_stderr("warn", {"log_level": "warn", "block_size": 4096})
    assert said.startswith("refused") and "block_size cannot change" in said, said
