"""``privet site check``: a site's node config read as Flower reads it, checked with the ClientApp's rules.

Two independent readers meet here: Flower's own ``parse_config_args`` (what ``flower-supernode``
does with ``--node-config``) and privet's pair-by-pair reader. Every printed command is read back by
Flower's parser and must give the same node config; every string privet refuses for its syntax is
one Flower's parser refuses too (without naming the key, which privet does).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
import tomli_w
from flwr.common.config import parse_config_args

from client.profile import resolve_profile
from privet.site import NODE_KEYS, check_site, parse_node_config
from protocol import keys

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def site(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "ca.crt").write_text("certificate")
    (tmp_path / "supernode-0").write_text("key")
    (tmp_path / "ledgers").mkdir()
    return {"ca": str(tmp_path / "ca.crt"), "key": str(tmp_path / "supernode-0"),
            "ledger": str(tmp_path / "ledgers" / "site 0.json")}  # a space in the path, on purpose


def _check(node_config: str, site: dict[str, str], **kw):
    return check_site(node_config, superlink="fl.example.org:9092", root_certificates=site["ca"],
                      private_key=site["key"], **kw)


def _node_config_of(command: list[str]) -> str:
    return command[command.index("--node-config") + 1]


def test_the_printed_command_gives_flower_the_same_node_config(site):
    text = (f'partition-id=1 num-partitions=3 client-id="site-1" epsilon=2.5 delta=1e-5 '
            f'ledger-path="{site["ledger"]}" allow-evaluation=false max-examples=600 noise-source="os"')
    check = _check(text, site)
    assert check.problems == []
    # what the shell hands flower-supernode, read by Flower's own parser
    argv = shlex.split(shlex.join(check.command))
    assert argv[0] == "flower-supernode" and argv[argv.index("--superlink") + 1] == "fl.example.org:9092"
    flower = parse_config_args([_node_config_of(argv)])
    assert flower == check.node_config == parse_config_args([text])
    assert flower[keys.NODE_LEDGER_PATH] == site["ledger"] and flower[keys.NODE_EPSILON] == 2.5


@pytest.mark.parametrize("text, key", [
    ("partition-id=0 num-partitions=3 epsilon=abc", "epsilon"),
    ("partition-id=0 num-partitions=3 client-id=site-0 epsilon=2", "client-id"),
    ("partition-id=0 num-partitions=3 epsilon=2 ledger-path=/var/lib/privet/l.json", "ledger-path"),
])
def test_a_value_flower_cannot_read_is_named_with_how_to_write_it(site, text, key):
    with pytest.raises(click.ClickException, match="invalid format"):  # Flower: no key named
        parse_config_args([text])
    check = _check(text, site)
    assert len(check.problems) == 1 and check.command == []
    problem = check.problems[0]
    assert f"node-config '{key}'" in problem
    if key == "epsilon":
        assert "epsilon=2.5" in problem and "written bare" in problem
    else:  # text: the quoted form, inside the shell's single quotes
        assert f'{key}="' in problem and "--node-config '" in problem


@pytest.mark.parametrize("node_config", [
    {"partition-id": 3, "num-partitions": 3, "epsilon": 1.0},
    {"partition-id": 0, "epsilon": 1.0},
    {"partition-id": 0, "num-partitions": 3, "epsilon": -1.0},
    {"partition-id": 0, "num-partitions": 3, "epsilon": "abc"},
    {"partition-id": 0, "num-partitions": 3, "epsilon": 1.0, "delta": 2.0},
    {"partition-id": 0, "num-partitions": 3, "epsilon": 1.0, "noise-source": "dice"},
    {"partition-id": 0, "num-partitions": 3, "epsilon": 1.0, "noise-source": "seeded"},
    {"partition-id": 0, "num-partitions": 3, "epsilon": 1.0, "allow-evaluation": "maybe"},
    {"partition-id": 0, "num-partitions": 3, "epsilon": 1.0, "max-examples": 0},
])
def test_the_clientapps_own_rules_refuse_what_site_check_refuses(site, node_config):
    with pytest.raises(ValueError) as raised:  # the ClientApp's reading of the same config
        resolve_profile(node_config, {})
    text = " ".join(f"{k}={tomli_w.dumps({'v': v}).split('=', 1)[1].strip()}" for k, v in node_config.items())
    assert parse_config_args([text]) == node_config  # the string a site would write
    check = _check(text, site)
    assert str(raised.value) in check.problems


def test_every_key_the_clientapp_reads_is_known_and_a_misspelt_one_gets_a_suggestion(site):
    values = {keys.NODE_PARTITION_ID: "0", keys.NODE_NUM_PARTITIONS: "2", keys.NODE_CLIENT_ID: '"s"',
              keys.NODE_EPSILON: "1.0", keys.NODE_DELTA: "1e-5", keys.NODE_LEDGER_PATH: f'"{site["ledger"]}"',
              keys.NODE_DATA_DIR: '"/usr/share/datasets/fashion-mnist"', keys.NODE_SHARD_CACHE: '"off"',
              keys.NODE_NOISE_SOURCE: '"csprng"', keys.NODE_ALLOW_SEEDED_NOISE: "false",
              keys.NODE_ALLOW_EVALUATION: "false", keys.NODE_REPORT_TRAIN_METRICS: "false",
              keys.NODE_MAX_EXAMPLES: "100"}
    # every key given here is one privet reads (a renamed key fails here); keys added later that need
    # companions (files) are checked by resolve_profile itself, which site check calls
    assert set(values) <= set(NODE_KEYS)
    check = _check(" ".join(f"{k}={v}" for k, v in values.items()), site)
    assert not any("is not a key privet reads" in p for p in check.problems), check.problems
    typo = _check("partition-id=0 num-partitions=2 epsilonn=1.0", site)
    assert any("'epsilonn'" in p and "did you mean 'epsilon'" in p for p in typo.problems)


def test_a_site_without_a_budget_is_valid_but_non_private_and_without_a_ledger_is_told_so(site):
    check = _check("partition-id=0 num-partitions=2", site)
    assert check.problems == []
    notes = " ".join(check.notes)
    assert "non-private runs only" in notes and "starts again at zero" in notes


def test_ledger_folder_and_files_are_checked(site, tmp_path):
    missing = _check(f'partition-id=0 num-partitions=2 epsilon=1.0 ledger-path="{tmp_path}/nowhere/l.json"', site)
    assert any("'ledger-path'" in p and "does not exist" in p for p in missing.problems)
    bad = tmp_path / "ledgers" / "bad.json"
    bad.write_text("{not a ledger")
    broken = _check(f'partition-id=0 num-partitions=2 epsilon=1.0 ledger-path="{bad}"', site)
    assert any("'ledger-path'" in p and "bad.json" in p for p in broken.problems)
    no_cert = check_site("partition-id=0 num-partitions=2", superlink="h:9092", root_certificates=None,
                         private_key=str(tmp_path / "absent"))
    assert any("--root-certificates" in p for p in no_cert.problems)
    assert any("--auth-supernode-private-key" in p and "no such file" in p for p in no_cert.problems)


def test_the_cli_prints_only_the_command_on_stdout_or_exits_2(site):
    def privet(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "privet.cli", "site", "check", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=120, check=False)

    ok = privet("--node-config", 'partition-id=0 num-partitions=2 client-id="site-0" epsilon=2.5',
                "--root-certificates", site["ca"], "--auth-supernode-private-key", site["key"])
    assert ok.returncode == 0, ok.stderr
    (line,) = ok.stdout.splitlines()
    argv = shlex.split(line)
    assert argv[0] == "flower-supernode"
    assert parse_config_args([_node_config_of(argv)]) == {"partition-id": 0, "num-partitions": 2,
                                                           "client-id": "site-0", "epsilon": 2.5}
    bad = privet("--node-config", "partition-id=0 num-partitions=2 epsilon=abc", "--insecure")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "'epsilon'" in bad.stderr and "Traceback" not in bad.stderr


def test_a_toml_file_is_read_like_flowers(tmp_path):
    path = tmp_path / "site.toml"
    path.write_text('partition-id = 0\nnum-partitions = 2\nclient-id = "a"\nepsilon = 1.5\n')
    assert parse_node_config(str(path)) == parse_config_args([str(path)])
