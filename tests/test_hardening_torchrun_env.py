"""Torchrun variables left in the environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT) give one clear line and exit 2 from a lab's ranks: no traceback, no rendezvous that waits
for a peer that never comes."""

from __future__ import annotations

import socket

import pytest

from tutor.bench import ranks
from tutor.cli import main


def leftover(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE",
                 "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def closed_port() -> int:
    with socket.socket() as probe:  # bound, then closed: nothing listens there afterwards
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def lab_error(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(["lab", "ddp", "budget_s=0.5"])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("[")]
    assert exit_.value.code == 2 and len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


def test_rank_variables_without_a_rendezvous_address(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    leftover(monkeypatch, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0")
    line = lab_error(capsys)
    assert "MASTER_ADDR and MASTER_PORT are not" in line and "unset RANK WORLD_SIZE LOCAL_RANK" in line


@pytest.mark.parametrize(("rank", "world", "port"), [("2", "2", "29500"), ("0", "0", "29500"), ("0", "2", "70000")])
def test_values_that_cannot_describe_a_job(monkeypatch: pytest.MonkeyPatch, rank: str, world: str, port: str) -> None:
    leftover(monkeypatch, RANK=rank, WORLD_SIZE=world, LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    with pytest.raises(ranks.UserError, match="cannot describe a job"):
        ranks.torchrun_job()


def test_a_rank_whose_rank_0_is_gone_stops_with_one_line(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    leftover(monkeypatch, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1",
             MASTER_PORT=str(closed_port()))
    monkeypatch.setattr(ranks, "RENDEZVOUS_TIMEOUT_S", 1.0)
    line = lab_error(capsys)
    assert "rank 1 of 2 found no torchrun job at 127.0.0.1:" in line and "nothing listens there" in line


def test_rank_0_waiting_for_peers_that_never_come_stops_with_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    leftover(monkeypatch, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
             MASTER_PORT=str(closed_port()))
    monkeypatch.setattr(ranks, "RENDEZVOUS_TIMEOUT_S", 2.0)
    line = lab_error(capsys)
    assert "rank 0 of 2 found no torchrun job" in line and "within 2 s" in line
