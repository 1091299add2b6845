"""The queue keeps its word to a patient client, seen with the load tool users already run: ghz with
64 concurrent callers and a 30 s timeout against a multiplexer with maxInFlight 4, maxQueued 64 and
queueTimeout 3s (room in its queue for every caller) in front of a simulator at 20 ms a batch.
Issue 32 found 542 of 600 refused ("the queue is standing") where TEI alone served all 600; every
call must be served through the sidecar as TEI alone serves it. ghz is the real one, built from
the Go module proxy by tools/go-tool.sh (TEIFLEET_GHZ)."""

import json
import os
import pathlib
import subprocess

GHZ = os.environ["TEIFLEET_GHZ"]
TEI = os.environ["TEIFLEET_SLOW_SIM_GRPC"]
SIDECAR = os.environ["TEIFLEET_PATIENT_GRPC"]
PROTO = pathlib.Path(__file__).resolve().parents[2] / "proto"


def ghz(target: str) -> dict:
    """ghz -c 64 -n 600 with a 30 s timeout per call; its JSON report."""
    done = subprocess.run(
        [GHZ, "--insecure", "--import-paths", str(PROTO), "--proto", "tei/v1/tei.proto",
         "--call", "tei.v1.Embed.Embed", "-d", json.dumps({"inputs": "What is Deep Learning?"}),
         "-c", "64", "-n", "600", "--timeout", "30s", "--format", "json", target],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"ghz failed: {done.stderr}"
    return json.loads(done.stdout)


def test_ghz_with_64_patient_callers_is_served_through_the_sidecar_as_by_tei_alone():
    direct = ghz(TEI)
    assert direct["statusCodeDistribution"] == {"OK": 600}, direct.get("errorDistribution")
    through = ghz(SIDECAR)
    assert through["statusCodeDistribution"] == {"OK": 600}, through.get("errorDistribution")
