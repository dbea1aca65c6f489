#!/usr/bin/env python3
"""A stand-in for vLLM's ZmqEventPublisher (vllm/distributed/kv_events.py)
built on Debian's python3-zmq and python3-msgpack: a bound PUB sending
[topic, seq (8-byte big-endian), payload] and a bound ROUTER answering
[identity, b"", start] with [identity, b"", topic, seq, payload] per
buffered batch and [identity, b"", b"", END_SEQ, b""] at the end (vLLM >=
0.26). Payloads are packed the way msgspec packs vLLM's structs: the batch
as an array, events as maps tagged under "type" (default) or as tag-first
arrays (--array).

Prints {"pub": ..., "replay": ...} on stdout, publishes the first batches,
then obeys stdin lines: "more N LOST" publishes N batches, not sending
seq LOST on the live socket (still replayable); "quit" exits.
"""
import json
import sys
import time

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def event(i, array):
    hashes = [1000 + i]
    if array:
        return ["BlockStored", hashes, None if i == 0 else 999 + i, [i, i + 1], 16,
                None, "GPU", None, None, None, None, None]
    return {"type": "BlockStored", "block_hashes": hashes,
            "parent_block_hash": None if i == 0 else 999 + i,
            "token_ids": [i, i + 1], "block_size": 16, "lora_id": None,
            "medium": "GPU", "lora_name": None}


def main():
    array = "--array" in sys.argv
    topic = b"kv@py@model"
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
    router = ctx.socket(zmq.ROUTER)
    rep_port = router.bind_to_random_port("tcp://127.0.0.1")
    print(json.dumps({"pub": f"tcp://127.0.0.1:{pub_port}",
                      "replay": f"tcp://127.0.0.1:{rep_port}"}), flush=True)
    buffer = []
    seq = 0

    def publish(lost=None):
        nonlocal seq
        payload = msgpack.packb([time.time(), [event(seq, array)], 0], use_bin_type=True)
        buffer.append((seq, payload))
        if seq != lost:
            pub.send_multipart((topic, seq.to_bytes(8, "big"), payload))
        seq += 1

    for _ in range(5):
        publish()
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    while True:
        ready = dict(poller.poll(30000))
        if not ready:
            return
        if router in ready:
            frames = router.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            start = int.from_bytes(start, "big")
            for s, payload in buffer:
                if s >= start:
                    router.send_multipart((client, b"", topic, s.to_bytes(8, "big"), payload))
            router.send_multipart((client, b"", b"", END_SEQ, b""))
        if sys.stdin.fileno() in ready:
            line = sys.stdin.readline().split()
            if not line or line[0] == "quit":
                break
            n, lost = int(line[1]), int(line[2])
            first = seq
            for _ in range(n):
                publish(lost=first + lost)
    pub.close(linger=0)
    router.close(linger=0)
    ctx.term()


if __name__ == "__main__":
    main()
