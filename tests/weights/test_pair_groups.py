"""DCS pair groups (relax/weights/transport.py): the presence rendezvous before a pair's group is made, so a peer
that died before it fails the session within a check instead of holding the holder for dcs.timeout_s."""

import threading

import pytest
import torch

from relax.weights.transport import PairGroups, store


@pytest.fixture
def tcp_store():
    st = store("127.0.0.1", 0, master=True, timeout_s=30, wait_for_workers=False)
    yield ("127.0.0.1", st.port)


def test_a_holder_stops_waiting_for_a_peer_whose_session_was_abandoned(tcp_store):
    asked = []

    def abandoned(sess):  # the coordinator's answer: the receiver was marked dead after the second check
        asked.append(sess["sid"])
        return len(asked) >= 2

    holder = PairGroups(tcp_store, timeout_s=30, staging_device="cpu", abandoned=abandoned)
    sess = {"sid": "s1", "src": "actor", "dst": "rollout-1", "group": "g-dead", "version": 1}
    with pytest.raises(RuntimeError, match="abandoned"):  # not the TimeoutError of timeout_s
        holder.send(sess, [torch.zeros(4)])
    assert asked == ["s1", "s1"] and holder.made == 0


def test_both_ends_meet_and_move_the_buffers(tcp_store):
    sess = {"sid": "s2", "src": "actor", "dst": "rollout-0", "group": "g-live", "version": 1}
    sent, got = [torch.arange(6, dtype=torch.float32)], [torch.zeros(6)]
    holder = PairGroups(tcp_store, timeout_s=30, staging_device="cpu", abandoned=lambda s: False)
    receiver = PairGroups(tcp_store, timeout_s=30, staging_device="cpu", abandoned=lambda s: False)
    t = threading.Thread(target=holder.send, args=(sess, sent))
    t.start()
    receiver.receive(sess, got)
    t.join(30)
    assert torch.equal(got[0], sent[0]) and holder.made == receiver.made == 1
