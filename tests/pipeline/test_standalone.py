"""`hastore pipeline stats --master spark://...` on a real Spark standalone master and worker,
started from pyspark's own distribution on loopback and stopped by pid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pyspark
import pytest

from node.cluster.process import free_port
from pipeline_helpers import sample_messages, write_store

pytestmark = pytest.mark.integration

SPARK_HOME = os.path.dirname(pyspark.__file__)
START_TIMEOUT_S = 120
JOB_TIMEOUT_S = 300


def _wait_for_line(path: str, text: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return
        if process.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"{text!r} not seen in {path}:\n{open(path, errors='replace').read()[-3000:]}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)


def test_stats_on_a_standalone_cluster(tmp_path):
    store = write_store(str(tmp_path / "n1"), sample_messages(600), node="g1-n1", group="g1")
    env = {**os.environ, "SPARK_HOME": SPARK_HOME, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOG_DIR": str(tmp_path), "SPARK_NO_DAEMONIZE": "1"}
    spark_class = os.path.join(SPARK_HOME, "bin", "spark-class")
    port = free_port()
    master_log, worker_log = str(tmp_path / "master.log"), str(tmp_path / "worker.log")
    processes = []
    try:
        with open(master_log, "w") as log:
            processes.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                 "--webui-port", "0"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        _wait_for_line(master_log, "I have been elected leader", processes[0], START_TIMEOUT_S)
        with open(worker_log, "w") as log:
            processes.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}", "--host",
                 "127.0.0.1", "--webui-port", "0", "--cores", "2", "--memory", "1500m", "--work-dir",
                 str(tmp_path / "work")], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        _wait_for_line(worker_log, "Successfully registered with master", processes[1], START_TIMEOUT_S)
        job = subprocess.run([sys.executable, "-m", "node.cli", "pipeline", "stats", store, "--master",
                              f"spark://127.0.0.1:{port}", "--json"], env=env, capture_output=True, text=True,
                             timeout=JOB_TIMEOUT_S)
        assert job.returncode == 0, job.stderr[-3000:]
        result = json.loads(job.stdout.strip().splitlines()[-1])
        assert result["messages"] == 600
        assert {row["topic"]: row["messages"] for row in result["topics"]} == {"orders": 200, "payments": 200,
                                                                               "audit": 200}
        assert "Launching executor" in open(master_log).read()     # the job ran on the cluster's executor
    finally:
        for process in reversed(processes):
            _stop(process)
