#!/usr/bin/env python3
"""Container health check for the privet image (installed as ``privet-healthcheck``).

Healthy when the Flower process answers ``SERVING`` on its gRPC health service
(``--health-server-address``, default checked: ``127.0.0.1:8081``) and, if
``PRIVET_HEALTH_TCP`` lists ``host:port`` pairs (comma-separated; e.g. the SuperLink's Fleet
API ``127.0.0.1:9092``), every one of them accepts a TCP connection. Exit 0 healthy, 1 not.
"""

from __future__ import annotations

import os
import socket
import sys


def grpc_serving(address: str, timeout: float = 3.0) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        return reply.status == health_pb2.HealthCheckResponse.SERVING


def tcp_open(address: str, timeout: float = 3.0) -> bool:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
        return True


def main() -> int:
    health = os.environ.get("PRIVET_HEALTH_ADDRESS", "127.0.0.1:8081")
    try:
        if not grpc_serving(health):
            print(f"unhealthy: {health} is not SERVING")
            return 1
        for address in filter(None, os.environ.get("PRIVET_HEALTH_TCP", "").split(",")):
            tcp_open(address.strip())
    except Exception as exc:  # noqa: BLE001 - any failure means unhealthy
        print(f"unhealthy: {type(exc).__name__}: {exc}")
        return 1
    print("healthy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
