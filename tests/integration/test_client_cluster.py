"""Contract test against the real fanout layer (``fanout up``: local Ray, LMDB store): a valid
submission is acknowledged after it is durable, an invalid trigger comes back as an MQTT 5 negative PUBACK
(or on MQTT 3.1.1 on ``$SDV-FANOUT/errors/<client_id>``) and surfaces as ``FanoutRejected`` naming the field."""
from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from fanout.client import FanoutClient, FanoutRejected
from tests.integration.client_fixtures import FANOUT_BIN, _readline, client_kwargs


@pytest.fixture
def cluster(tmp_path: Path):
    cfg = tmp_path / "fanout.toml"
    cfg.write_text('[mqtt]\nsys_interval = "0s"\n')  # no users: platform/platform dev login on loopback
    proc = subprocess.Popen([str(FANOUT_BIN), "up", "--port", "0", "--data-dir", str(tmp_path / "var"), "--config", str(cfg)],
                            stdout=subprocess.PIPE, stderr=open(tmp_path / "up.log", "w"), text=True)
    try:
        line = _readline(proc, 120)
        assert line.startswith("fanout ready mqtt://"), f"fanout up did not start: {line!r}; see {tmp_path / 'up.log'}"
        yield int(line.strip().rsplit(":", 1)[1])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.parametrize("mqtt_version", ["5", "3.1.1"])
async def test_real_cluster_acks_valid_and_rejects_invalid_naming_the_field(cluster: int, tmp_path: Path,
                                                                           mqtt_version: str) -> None:
    """MQTT 5: a negative PUBACK (0x99, the field in its Reason String), the connection stays; 3.1.1: the
    errors topic, then the cluster closes the connection and the client reconnects."""
    kwargs = client_kwargs(cluster, tmp_path / "ob", username="platform", password="platform")
    async with FanoutClient(**kwargs, mqtt_version=mqtt_version) as client:
        ok = await client.submit(["WVWZZZ1JZ3W386752", "WVWZZZ1JZ3W386753"], b"blob-1", request_id="ok-1")
        await ok.acked(timeout=30)
        bad = await client.submit(["WVWZZZ1JZ3W386752", "bad vin!"], b"blob-1", request_id="bad-1")
        with pytest.raises(FanoutRejected) as info:
            await bad.acked(timeout=30)
        assert info.value.field == "ids[1]" and info.value.error == "invalid_trigger" and info.value.request_id == "bad-1"
        after = await client.submit(["WVWZZZ1JZ3W386754"], b"blob-2", request_id="ok-2")
        await after.acked(timeout=30)
        status = client.status()
        assert status.mqtt_version == mqtt_version
        if mqtt_version == "5":
            assert info.value.detail["reason_code"] == 0x99 and status.connects == 1  # no reconnect
        else:
            assert status.connects == 2  # the cluster closed the connection; the client reconnected
        [dead] = await client.dead_letters()
        assert dead.request_id == "bad-1" and "ids[1]" in dead.last_error
        assert await client.drain(10)
