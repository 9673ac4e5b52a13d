#!/usr/bin/env python3
"""A hand-played peer of fsdpd's join (daemon/cluster.c), for test_join_security.sh.

It speaks base/auth.h's handshake and proto/msg.h's framing itself, so that a test can be the
stranger, the misconfigured node or the fake leader that a real fsdpd never is:

  join_peer.py strangers HOST PORT SILENT DRIBBLING SECONDS
      SILENT connections that send nothing and DRIBBLING that send a byte a second, all held
      SECONDS; prints how many the leader closed before the end.
  join_peer.py join HOST PORT SECRET_HEX JOIN_JSON
      the handshake with the secret, then JOIN with JOIN_JSON's fields; prints the leader's
      answer as "TYPE BODY" (REFUSED {"reason": ...}), or "closed".
  join_peer.py fake-leader RENDEZVOUS_FILE HOST NODES LAUNCH PLAN_JSON
      writes a 0600 rendezvous file for LAUNCH naming a leader on HOST, admits one follower
      and sends it PLAN_JSON; prints "planned" once sent.
"""
import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
import sys
import time

MAGIC = b"FSDPAUT1"
CONTEXT = b"fsdpd daemons"
TYPES = {"JOIN": 14, "PLAN": 17, "REFUSED": 22}
NAMES = {v: k for k, v in TYPES.items()}


def proof(secret, initiator_proves, prover, verifier):
    head = b"fsdp-auth-v1" + (b"I" if initiator_proves else b"R") + struct.pack(">I", len(CONTEXT))
    return hmac.new(secret, head + CONTEXT + prover + verifier, hashlib.sha256).digest()


def recv_exactly(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise EOFError("peer closed")
        data += chunk
    return data


def handshake(s, secret, initiator):
    nonce = secrets.token_bytes(32)
    s.sendall(MAGIC + nonce)
    hello = recv_exactly(s, 40)
    assert hello[:8] == MAGIC, hello
    s.sendall(proof(secret, initiator, nonce, hello[8:]))
    theirs = recv_exactly(s, 32)
    if not hmac.compare_digest(theirs, proof(secret, not initiator, hello[8:], nonce)):
        raise ValueError("the peer does not know the secret")


def send_msg(s, kind, body):
    data = json.dumps(body).encode()
    s.sendall(b"FSDP" + struct.pack("<HHI", 1, TYPES[kind], len(data)) + data)


def recv_msg(s):
    magic, _version, kind, length = struct.unpack("<4sHHI", recv_exactly(s, 12))
    assert magic == b"FSDP", magic
    return NAMES.get(kind, str(kind)), json.loads(recv_exactly(s, length))


def strangers(host, port, silent, dribbling, seconds):
    socks = [socket.create_connection((host, int(port)), timeout=5) for _ in range(int(silent) + int(dribbling))]
    for s in socks:
        s.setblocking(False)
    closed = set()
    end = time.time() + float(seconds)
    while time.time() < end:
        for i, s in enumerate(socks):
            if i in closed:
                continue
            try:
                if i >= int(silent):
                    s.send(MAGIC[:1])
                if s.recv(4096) == b"":
                    closed.add(i)
            except BlockingIOError:
                pass
            except OSError:
                closed.add(i)
        time.sleep(1)
    print(f"{len(closed)} of {len(socks)} closed by the leader")


def join(host, port, secret_hex, join_json):
    s = socket.create_connection((host, int(port)), timeout=10)
    handshake(s, bytes.fromhex(secret_hex), True)
    send_msg(s, "JOIN", json.loads(join_json))
    try:
        kind, body = recv_msg(s)
        print(kind, json.dumps(body))
    except EOFError:
        print("closed")


def fake_leader(path, host, nodes, launch, plan_json):
    lsock = socket.socket()
    lsock.bind((host, 0))
    lsock.listen(4)
    secret = secrets.token_bytes(32)
    record = {"host": host, "port": lsock.getsockname()[1], "nodes": int(nodes), "job_id": "x", "restart": 0,
              "attempt": 0, "secret": secret.hex(), "nonce": secrets.token_hex(16), "launch": launch,
              "members": list(range(int(nodes))), "ended": ""}
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, json.dumps(record).encode())
    os.close(fd)
    os.rename(tmp, path)
    lsock.settimeout(30)
    s, _ = lsock.accept()
    handshake(s, secret, False)
    kind, _body = recv_msg(s)
    assert kind == "JOIN", kind
    send_msg(s, "PLAN", json.loads(plan_json))
    print("planned", flush=True)
    try:
        s.settimeout(30)
        s.recv(1)  # until the follower hangs up
    except OSError:
        pass


if __name__ == "__main__":
    {"strangers": strangers, "join": join, "fake-leader": fake_leader}[sys.argv[1]](*sys.argv[2:])
