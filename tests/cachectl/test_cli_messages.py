"""What an operator meets first: the parser's suggestions, `cachectl config`'s values and
sources, Config given strings, the call-record log label."""

from __future__ import annotations

import json
import os

import pytest

from cachectl.main import main as cachectl
from kernel_cache import Config, ConfigError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("KERNEL_CACHE_"):
            monkeypatch.delenv(name)


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = cachectl(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_mistyped_option_value_is_not_called_an_unknown_command(capsys):
    code, _, err = run(capsys, "list", "--sort", "sizee")
    assert code == 2 and err.strip() == ("cachectl: unknown value for --sort 'sizee'; did you mean 'size'? "
                                         "(see 'cachectl list --help')")
    code, _, err = run(capsys, "lisst")
    assert code == 2 and "unknown command 'lisst'; did you mean 'list'?" in err and "'cachectl --help'" in err


def test_an_unknown_option_points_to_the_commands_own_help(capsys):
    code, _, err = run(capsys, "list", "-x")
    assert code == 2 and "unrecognized arguments" in err and "(see 'cachectl list --help')" in err


def test_a_bare_number_is_no_duration(capsys):
    code, _, err = run(capsys, "prune", "--older-than", "30", "--dry-run")
    assert code == 2 and "has no unit" in err and "30s" in err and "d" in err
    with pytest.raises(ConfigError, match="KERNEL_CACHE_REMOTE_TTL: '?14'? has no unit"):
        Config.from_env({"KERNEL_CACHE_REMOTE_TTL": "14"})


def test_config_shows_values_as_they_are_written_and_where_they_came_from(capsys, monkeypatch, tmp_path):
    key = tmp_path / "team.key"
    key.write_bytes(os.urandom(32).hex().encode())
    key.chmod(0o600)
    monkeypatch.setenv("KERNEL_CACHE_SIGNING_KEY_FILE", str(key))
    monkeypatch.setenv("KERNEL_CACHE_MAX_BYTES", "1.5G")
    monkeypatch.setenv("KERNEL_CACHE_INTERCEPT", "jax_triton,ejkernel")
    code, out, _ = run(capsys, "config", "--json")
    assert code == 0
    rows = {r["variable"]: r for r in json.loads(out)["settings"]}
    assert rows["KERNEL_CACHE_SIGNING_KEY_FILE"]["source"] == "environment"
    assert rows["KERNEL_CACHE_SIGNING_KEY_FILE"]["value"].startswith("set (key id ")
    assert rows["KERNEL_CACHE_SIGNING_KEY"]["source"] == "unused" and rows["KERNEL_CACHE_SIGNING_KEY"]["value"] is None
    assert rows["KERNEL_CACHE_MAX_BYTES"]["value"] == "1536M"
    assert rows["KERNEL_CACHE_MEMORY_BYTES"]["value"] == "256M"
    assert rows["KERNEL_CACHE_LOCK_TIMEOUT"]["value"] == "10m"
    assert rows["KERNEL_CACHE_REMOTE_TIMEOUT"]["value"] == "250ms"
    assert rows["KERNEL_CACHE_REMOTE_TTL"]["value"] == "14d"
    assert rows["KERNEL_CACHE_INTERCEPT"]["value"] == "jax_triton,ejkernel"
    assert rows["KERNEL_CACHE_XLA"]["value"] == "0" and rows["KERNEL_CACHE_WINNERS"]["value"] == "1"
    for row in rows.values():  # each value reads back as the variable it came from
        if row["value"] is not None and row["source"] != "unused" and not row["value"].startswith("set"):
            Config.from_env({row["variable"]: row["value"]})
    code, text, _ = run(capsys, "config")
    assert "268435456" not in text and "600.0" not in text and "('jax_triton'" not in text


def test_config_accepts_sizes_and_durations_as_strings():
    config = Config(max_bytes="1G", memory_bytes="64M", lock_timeout="90s", remote_ttl="2d", dir="/tmp/x")
    assert (config.max_bytes, config.memory_bytes, config.lock_timeout, config.remote_ttl) == \
        (1 << 30, 64 << 20, 90.0, 172800.0)
    assert str(config.dir) == "/tmp/x" and config.with_(max_bytes="2G").max_bytes == 2 << 30
    with pytest.raises(ConfigError, match="max_bytes: expected a number of bytes"):
        Config(max_bytes=[1])
    with pytest.raises(ConfigError, match="max_bytes: cannot read"):
        Config(max_bytes="lots")


def test_a_call_records_log_label_counts_kernels_in_english():
    from lowering.records.call_records import record_label

    assert (record_label("add", 1), record_label("matmul", 3)) == ("add call record (1 kernel)",
                                                                  "matmul call record (3 kernels)")
