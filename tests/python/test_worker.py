"""ps_server.Worker against real ps-server processes on loopback (started by
ps_server.launch.Shards, authenticated with token files as by default): training steps
with exact results, a Byzantine worker held off by a robust rule, refusals as exceptions
that say which push, bad input refused before anything is sent, a shard restart, mutual
TLS, and the same training over the gRPC and the TCP data plane."""

import gc
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ps_server
from ps_server import aggregators
from ps_server.launch import Shards

TENSORS = [("w", 1000), ("b", 10)]
INIT = [np.linspace(-1, 1, 1000, dtype=np.float32), np.zeros(10, dtype=np.float32)]


def start_workers(shards, count, **options):
    return [ps_server.Worker(shards.addresses, w, TENSORS, initial=INIT if w == 0 else None,
                             token_file=shards.token_file(w), connect_timeout=30, **options)
            for w in range(count)]


def grads(value):
    return [np.full(1000, value, dtype=np.float32), np.full(10, value, dtype=np.float32)]


def push_round(worker, round, gs):
    for t, g in enumerate(gs):
        worker.push(t, round, g)
    worker.wait_pushes()


def pulled(worker, version):
    outs = [np.empty(1000, dtype=np.float32), np.empty(10, dtype=np.float32)]
    assert worker.pull_all(version, outs, timeout=30) == version
    return outs


def test_training_steps_apply_the_aggregate(server_bin):
    # Two shards, three workers, the mean, SGD with lr 0.5 and no momentum: after each
    # round the parameters move by exactly -0.5 x the mean of the pushes.
    with Shards(2, 3, aggregator="mean", lr=0.5, momentum=0.0, server=server_bin) as shards:
        workers = start_workers(shards, 3)
        assert [s["shard_id"] for s in workers[0].shards] == [0, 1]
        assert workers[1].start_version == 0
        expected = [a.copy() for a in INIT]
        for round in range(3):
            for i, w in enumerate(workers):
                push_round(w, round, grads(float(i + 1)))  # mean 2
            expected = [e - np.float32(0.5) * np.float32(2.0) for e in expected]
            for w in workers:
                got = pulled(w, round + 1)
                np.testing.assert_array_equal(got[0], expected[0])
                np.testing.assert_array_equal(got[1], expected[1])
        stats = workers[0].stats()
        assert stats["slices_pushed"] >= 3 * 2 and stats["slices_refused"] == 0
        for w in workers:
            w.close()


def test_shards_with_a_run_id_refuse_workers_of_another_run(server_bin):
    # docs/operations.md, "One model per run": a worker of another run, or of none, is
    # refused (wrong_run) before it touches the model; the run's own workers train.
    with Shards(1, 1, insecure=True, server=server_bin,
                server_args=("--run-id", "exp-1")) as shards:
        for run_id in ("exp-2", ""):
            with pytest.raises(ps_server.Refused, match="serves run 'exp-1'") as refused:
                ps_server.Worker(shards.addresses, 0, [("w", 4)],
                                 initial=[np.zeros(4, np.float32)], run_id=run_id,
                                 connect_timeout=30)
            assert refused.value.reason == "wrong_run"
        w = ps_server.Worker(shards.addresses, 0, [("w", 4)], initial=[np.zeros(4, np.float32)],
                             run_id="exp-1", connect_timeout=30)
        w.push(0, 0, np.ones(4, np.float32))
        w.wait_pushes()
        out = np.empty(4, np.float32)
        assert w.pull_all(1, [out], timeout=30) == 1
        w.close()


def test_a_byzantine_worker_is_held_off_by_a_robust_rule(server_bin):
    # Five workers, one of which pushes 1e6 everywhere: the mean would move the weights by
    # 1e5; the trimmed mean (f = 1) moves them as the honest pushes do, exactly as
    # ps_server.aggregators computes it.
    rng = np.random.default_rng(1)
    with Shards(1, 5, byzantine=1, aggregator="trimmed_mean", lr=1.0, momentum=0.0,
                server=server_bin) as shards:
        workers = start_workers(shards, 5)
        pushed = []
        for i, w in enumerate(workers):
            g = [np.full(1000, 1e6, np.float32), np.full(10, 1e6, np.float32)] if i == 4 else \
                [rng.normal(size=1000).astype(np.float32), rng.normal(size=10).astype(np.float32)]
            pushed.append(g)
            push_round(w, 0, g)
        got = pulled(workers[0], 1)
        for t in range(2):
            agg = aggregators.aggregate("trimmed_mean", np.stack([p[t] for p in pushed]), f=1)
            np.testing.assert_allclose(got[t], INIT[t] - agg, rtol=0, atol=1e-6)
            assert np.max(np.abs(got[t] - INIT[t])) < 5
        for w in workers:
            w.close()


def test_refusals_are_exceptions_that_say_which_push(server_bin):
    with Shards(1, 2, aggregator="mean", server=server_bin) as shards:
        a, b = start_workers(shards, 2)
        push_round(a, 0, grads(1.0))
        a.push("b", 0, grads(1.0)[1])  # the same slice and round again
        with pytest.raises(ps_server.Refused) as e:
            a.wait_pushes()
        assert e.value.reason == "duplicate" and e.value.code == "ALREADY_EXISTS"
        assert (e.value.tensor, e.value.round, e.value.shard) == ("b", 0, 0)
        assert isinstance(e.value.slice, int)
        assert "push of tensor 'b'" in str(e.value)
        push_round(b, 0, grads(1.0))
        pulled(a, 1)  # round 0 closed, with b's push
        b.push(0, 0, grads(1.0)[0])  # b's again: the duplicate it is
        with pytest.raises(ps_server.Refused) as e:
            b.wait_pushes()
        assert e.value.reason == "duplicate" and e.value.tensor == "w"
        push_round(a, 1, grads(1.0))
        push_round(b, 1, grads(1.0))
        pulled(a, 2)  # round 1 closed too
        b.push(0, 0, grads(1.0)[0])  # late
        with pytest.raises(ps_server.Refused) as e:
            b.wait_pushes()
        assert e.value.reason == "late" and e.value.tensor == "w"
        a.close()
        b.close()


def test_a_layout_mismatch_names_the_tensor_that_differs(server_bin):
    """A worker whose model differs from the registered one (a layer resized, say) is
    refused with the first tensor that differs, name and size, not two hashes."""
    with Shards(1, 2, server=server_bin) as shards:
        (a,) = start_workers(shards, 1)
        with pytest.raises(ps_server.Refused) as e:
            ps_server.Worker(shards.addresses, 1, [("w", 1000), ("b", 12)],
                             token_file=shards.token_file(1), connect_timeout=30)
        assert e.value.reason == "layout_mismatch"
        assert ("tensor 1 differs: the shard's is 'b' (10 elements, priority 1), the "
                "worker's 'b' (12 elements, priority 1)") in str(e.value), str(e.value)
        a.close()


def test_bad_input_is_refused_before_anything_is_sent(server_bin):
    torch = pytest.importorskip("torch")
    with Shards(1, 1, server=server_bin) as shards:
        (w,) = start_workers(shards, 1)
        before = w.stats()["slices_pushed"]
        with pytest.raises(ValueError, match="1000"):
            w.push(0, 0, np.zeros(999, np.float32))
        with pytest.raises(TypeError, match="float32"):
            w.push(0, 0, np.zeros(1000, np.float64))
        with pytest.raises(ValueError, match="contiguous"):
            w.push(0, 0, np.zeros(2000, np.float32)[::2])
        nan = np.zeros(1000, np.float32)
        nan[17] = np.nan
        with pytest.raises(ValueError, match="not finite"):
            w.push(0, 0, nan)
        with pytest.raises(ValueError, match="no tensor 'nope'"):
            w.push("nope", 0, nan)
        with pytest.raises(TypeError, match="float32"):
            w.push(1, 0, torch.zeros(10, dtype=torch.float64))
        with pytest.raises(ValueError, match="contiguous"):
            w.push(0, 0, torch.zeros(1000, 2).t()[0])
        with pytest.raises(ValueError, match="layout has 2 tensors"):
            w.pull_all(0, [np.empty(1000, np.float32)])
        with pytest.raises(ValueError, match="timeout"):
            w.pull(0, 0, np.empty(1000, np.float32), timeout=-1)
        w.wait_pushes()  # nothing was queued, nothing failed
        assert w.stats()["slices_pushed"] == before
        # Torch tensors in and out: the pull writes into the tensors' own memory.
        push_round(w, 0, [torch.ones(1000), torch.ones(10)])
        outs = [torch.empty(1000), torch.empty(10)]
        assert w.pull_all(1, outs, timeout=30) == 1
        np.testing.assert_allclose(outs[0].numpy(), INIT[0] - np.float32(0.1), atol=1e-6)
        w.close()
        with pytest.raises(ValueError, match="closed"):
            w.wait_pushes()


def test_pull_tickets_and_threads(server_bin):
    # start_pull_all returns at once; a thread pushes meanwhile (the GIL is free while the
    # pull waits); tensors arrive and the ticket reports them.
    with Shards(1, 1, aggregator="mean", lr=1.0, momentum=0.0, server=server_bin) as shards:
        (w,) = start_workers(shards, 1)
        outs = [np.empty(1000, np.float32), np.empty(10, np.float32)]
        ticket = w.start_pull_all(1, outs, timeout=30)
        assert not ticket.ready(0)
        with pytest.raises(ValueError, match="still running"):
            w.close()
        pusher = threading.Thread(target=push_round, args=(w, 0, grads(2.0)))
        pusher.start()
        ticket.wait_tensor(0)
        assert ticket.wait() == 1
        pusher.join()
        np.testing.assert_array_equal(outs[1], np.full(10, -2.0, np.float32))
        del ticket
        w.close()


@pytest.mark.parametrize("plane", ["grpc", "tcp"])
def test_training_goes_on_across_a_shard_restart(server_bin, tmp_path, plane):
    # Shard 1 is killed (SIGKILL) after round 2 and restarts from its checkpoint (on the
    # TCP plane with the same data port); the workers' next pushes are retried until it
    # is back, and training continues with exact results.
    args = ["--checkpoint-dir", str(tmp_path), "--checkpoint-every-rounds", "1",
            "--checkpoint-interval-s", "0"]
    with Shards(2, 2, aggregator="mean", lr=1.0, momentum=0.0, server_args=args,
                server=server_bin, data_plane=plane) as shards:
        workers = start_workers(shards, 2, max_attempts=30)
        for round in range(3):
            for w in workers:
                push_round(w, round, grads(1.0))
            pulled(workers[0], round + 1)
        # Checkpoints are written behind the rounds: kill once version 3's is complete.
        checkpoint = tmp_path / "shard-1" / f"checkpoint-{3:020d}.pscp"
        deadline = time.monotonic() + 60  # loaded machines write slowly
        while not checkpoint.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert checkpoint.exists(), shards.log_tail(1)
        shards.restart(1)
        # As in every round: a round's pushes go out once its version was pulled (a push
        # for a round whose predecessor the shard is still aggregating is refused).
        for round in range(3, 5):
            for w in workers:
                push_round(w, round, grads(1.0))
            pulled(workers[0], round + 1)
        got = pulled(workers[1], 5)
        np.testing.assert_allclose(got[0], INIT[0] - 5.0, atol=1e-5)
        np.testing.assert_allclose(got[1], INIT[1] - 5.0, atol=1e-5)
        assert [w.data_plane for w in workers] == [plane, plane]
        for w in workers:
            w.close()


def test_close_in_another_thread_while_a_call_waits(server_bin):
    # A pull waiting in one thread keeps the worker alive when another thread closes
    # it; the pull then ends (here by its timeout) and later calls are refused.
    with Shards(1, 1, server=server_bin) as shards:
        (w,) = start_workers(shards, 1)
        outs = [np.empty(1000, np.float32), np.empty(10, np.float32)]
        errors = []

        def pull():
            try:
                w.pull_all(5, outs, timeout=1.0)  # version 5 never comes
            except ps_server.Error as e:
                errors.append(e)

        t = threading.Thread(target=pull)
        t.start()
        time.sleep(0.2)
        w.close()
        t.join(timeout=30)
        assert not t.is_alive()
        assert len(errors) == 1 and errors[0].code in ("DEADLINE_EXCEEDED", "CANCELLED",
                                                        "UNAVAILABLE"), errors
        with pytest.raises(ValueError, match="closed"):
            w.pull_all(0, outs)


MAKE_CERTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy",
                          "tls", "make-certs.sh")


@pytest.mark.parametrize("plane", ["grpc", "tcp"])
def test_mutual_tls_workers_are_who_their_certificate_says(server_bin, tmp_path, plane):
    # Shards serving mTLS with deploy/tls/make-certs.sh's certificates (as in Kubernetes),
    # on either data plane: workers with theirs train; a worker's certificate cannot join
    # as another worker; a plaintext client does not get in.
    certs = str(tmp_path / "certs")
    subprocess.run(["bash", MAKE_CERTS, certs, "2", "2"], check=True,
                   stdout=subprocess.DEVNULL, timeout=120)
    with Shards(2, 2, aggregator="mean", lr=1.0, momentum=0.0, tls_dir=certs,
                server=server_bin, data_plane=plane) as shards:
        env = shards.env(1)
        assert env["PS_TLS_CERT"].endswith("worker-1.pem") and "PS_TOKEN_FILE" not in env
        with pytest.raises(ps_server.Error, match="worker-1 may not join as worker 0"):
            ps_server.Worker(shards.addresses, 0, TENSORS, initial=INIT, connect_timeout=30,
                             **shards.tls(1))
        with pytest.raises(ps_server.Error):
            ps_server.Worker(shards.addresses, 0, TENSORS, initial=INIT, connect_timeout=2,
                             max_attempts=1)
        workers = [ps_server.Worker(shards.addresses, w, TENSORS,
                                    initial=INIT if w == 0 else None, connect_timeout=30,
                                    **shards.tls(w)) for w in range(2)]
        assert [w.data_plane for w in workers] == [plane, plane]
        for i, w in enumerate(workers):
            push_round(w, 0, grads(float(2 * i + 1)))  # mean 2
        got = pulled(workers[1], 1)
        np.testing.assert_array_equal(got[0], INIT[0] - np.float32(2.0))
        for w in workers:
            w.close()


def train_seeded(shards, planes, rounds=3):
    """Three workers (worker w asking for data plane planes[w]) push seeded random
    gradients, different per worker, tensor and round; what every worker pulls after each
    round, and the planes they report."""
    workers = [ps_server.Worker(shards.addresses, w, TENSORS, initial=INIT if w == 0 else None,
                                token_file=shards.token_file(w), connect_timeout=30,
                                slice_elems=128, data_plane=planes[w]) for w in range(3)]
    rng = np.random.default_rng(7)
    pushed, history = [], []
    for round in range(rounds):
        gs = [[rng.normal(size=1000).astype(np.float32), rng.normal(size=10).astype(np.float32)]
              for _ in workers]
        for w, g in zip(workers, gs):
            push_round(w, round, g)
        pushed.append(gs)
        history.append([pulled(w, round + 1) for w in workers])
    reported = [(w.data_plane, [s["data_plane"] for s in w.shards]) for w in workers]
    for w in workers:
        w.close()
    return pushed, history, reported


def test_the_tcp_data_plane_trains_as_the_grpc_plane_does(server_bin):
    # The same seeded run on two shards over each data plane (ps-server --data-plane, set
    # by Shards): worker 0 asks for the shards' plane, the others follow whatever the
    # shards run. Slices of 128 values make every push and pull several frames. A TCP
    # shard refuses gRPC pushes and pulls, so the TCP run cannot have gone over gRPC;
    # every parameter each worker pulls after each round is bit for bit the gRPC run's,
    # and both are the shards' SGD on the mean of the pushes.
    runs = {}
    for plane in ("grpc", "tcp"):
        with Shards(2, 3, aggregator="mean", lr=0.5, momentum=0.0, server=server_bin,
                    data_plane=plane) as shards:
            assert len(shards.data_ports) == (2 if plane == "tcp" else 0)
            runs[plane] = train_seeded(shards, [plane, None, None])
        assert runs[plane][2] == [(plane, [plane, plane])] * 3, runs[plane][2]
    pushed, grpc_history, _ = runs["grpc"]  # the same seed: the TCP run pushed the same
    expected = [a.copy() for a in INIT]
    for round, (tcp_round, grpc_round) in enumerate(zip(runs["tcp"][1], grpc_history)):
        for t in range(2):
            mean = np.mean(np.stack([g[t] for g in pushed[round]]), axis=0, dtype=np.float64)
            expected[t] = expected[t] - 0.5 * mean
        for w in range(3):
            for t in range(2):
                np.testing.assert_array_equal(tcp_round[w][t], grpc_round[w][t],
                                              err_msg=f"round {round}, worker {w}, tensor {t}")
                np.testing.assert_allclose(tcp_round[w][t], expected[t], rtol=0, atol=1e-5)


def test_borrowed_pushes_hold_their_arrays_until_wait_pushes(server_bin):
    # borrow=True (PushOptions::borrow): fp32 pushes over the TCP plane are sent from the
    # caller's array, which the worker holds (a buffer view: one more reference) until
    # wait_pushes returns, so an array whose only reference was the call's survives. The
    # parameters are bit for bit the shards' SGD on the mean, as with copied pushes.
    with Shards(2, 2, aggregator="mean", lr=0.5, momentum=0.0, server=server_bin,
                data_plane="tcp") as shards:
        borrowing = ps_server.Worker(shards.addresses, 0, TENSORS, initial=INIT, borrow=True,
                                     token_file=shards.token_file(0), connect_timeout=30)
        copying = ps_server.Worker(shards.addresses, 1, TENSORS,
                                   token_file=shards.token_file(1), connect_timeout=30)
        expected = [a.copy() for a in INIT]
        for round in range(3):
            kept = grads(1.0)
            before = [sys.getrefcount(g) for g in kept]
            for t in range(2):
                copying.push(t, round, kept[t])
            assert [sys.getrefcount(g) for g in kept] == before  # copied: nothing held
            copying.wait_pushes()
            borrowing.push(0, round, np.full(1000, 3.0, dtype=np.float32))
            borrowing.push(1, round, np.full(10, 3.0, dtype=np.float32))
            gc.collect()  # the arrays' only references are the worker's
            borrowing.wait_pushes()
            expected = [e - np.float32(0.5) * np.float32(2.0) for e in expected]
            for w in (borrowing, copying):
                got = pulled(w, round + 1)
                np.testing.assert_array_equal(got[0], expected[0])
                np.testing.assert_array_equal(got[1], expected[1])
        assert borrowing.stats()["slices_borrowed"] >= 3 * 2
        assert copying.stats()["slices_borrowed"] == 0
        # Held while unanswered, released by wait_pushes.
        array = np.full(1000, 1.0, dtype=np.float32)
        refs = sys.getrefcount(array)
        borrowing.push(0, 3, array)
        assert sys.getrefcount(array) == refs + 1
        borrowing.push(1, 3, np.full(10, 1.0, dtype=np.float32))
        borrowing.wait_pushes()
        assert sys.getrefcount(array) == refs
        copying.push(0, 3, np.full(1000, 1.0, dtype=np.float32))
        copying.push(1, 3, np.full(10, 1.0, dtype=np.float32))
        copying.wait_pushes()
        np.testing.assert_array_equal(pulled(borrowing, 4)[0],
                                      expected[0] - np.float32(0.5) * np.float32(1.0))
        for w in (borrowing, copying):
            w.close()


def test_a_worker_asking_for_the_other_data_plane_is_refused(server_bin):
    # Set to one plane, a worker does not join shards on the other: the shard's data_plane
    # refusal, naming both fixes.
    for shards_plane, asked in (("tcp", "grpc"), ("grpc", "tcp")):
        with Shards(1, 1, server=server_bin, data_plane=shards_plane) as shards:
            with pytest.raises(ps_server.Refused) as e:
                ps_server.Worker(shards.addresses, 0, TENSORS, initial=INIT,
                                 token_file=shards.token_file(0), connect_timeout=30,
                                 data_plane=asked)
            assert e.value.reason == "data_plane" and e.value.code == "FAILED_PRECONDITION"
            assert f"asks for the {asked} data plane" in str(e.value)
            assert f"start every shard with --data-plane {asked}" in str(e.value)


@pytest.mark.parametrize("plane", ["udp", "TCP", "", 1, b"tcp"])
def test_a_bad_data_plane_is_a_value_error_before_anything_is_sent(plane):
    with pytest.raises(ValueError, match=r'data_plane must be "grpc", "tcp" or None'):
        ps_server.Worker(["127.0.0.1:1"], 0, TENSORS, initial=INIT, data_plane=plane,
                         connect_timeout=1)


def test_adopt_takes_the_roots_values_only_with_the_quorums_votes(server_bin):
    # Mid-run adoption (broadcast_parameters after training started), three workers with
    # f = 1 on two shards: the quorum is two votes. The Byzantine worker 2 alone, naming
    # itself, gets nowhere (its upload times out waiting for votes); the root alone
    # neither; with worker 1's vote the shards take worker 0's values as version 2.
    with Shards(2, 3, byzantine=1, aggregator="median", lr=0.5, momentum=0.9,
                server=server_bin) as shards:
        workers = start_workers(shards, 3)
        for i, w in enumerate(workers):
            push_round(w, 0, grads(1.0))
        trained = pulled(workers[0], 1)
        mine = [np.full(1000, 3.0, np.float32), np.full(10, -3.0, np.float32)]
        with pytest.raises(ps_server.Error, match=r"1 of the 2 workers it takes asked to adopt "
                                                  r"worker 2's values at round 1"):
            workers[2].adopt(1, 2, values=mine, timeout=0.5)
        with pytest.raises(ps_server.Error, match=r"1 of the 2 workers it takes asked to adopt "
                                                  r"worker 0's values at round 1"):
            workers[0].adopt(1, 0, values=mine, timeout=0.5)
        with pytest.raises(ValueError, match="only the root uploads its values"):
            workers[1].adopt(1, 0, values=mine)
        with pytest.raises(ValueError, match="is the root of the adoption and passed no values"):
            workers[0].adopt(1, 0)
        for w in workers:  # nothing moved meanwhile
            got = pulled(w, 1)
            np.testing.assert_array_equal(got[0], trained[0])
        workers[1].adopt(1, 0)
        workers[0].adopt(1, 0, values=mine, timeout=10)
        for w in workers:
            got = pulled(w, 2)
            np.testing.assert_array_equal(got[0], mine[0])
            np.testing.assert_array_equal(got[1], mine[1])
        # The momentum starts afresh from the adopted values: v = g, w = 3 - 0.5 x 1.
        for w in workers:
            push_round(w, 2, grads(1.0))
        got = pulled(workers[2], 3)
        np.testing.assert_allclose(got[0], np.full(1000, 2.5, np.float32))
        np.testing.assert_allclose(got[1], np.full(10, -3.5, np.float32))
        # The voter that came last finds the shards past the round: done, not an error.
        workers[2].adopt(1, 0)
        for w in workers:
            w.close()


def test_rounds_stop_waiting_for_a_worker_that_died_or_left(server_bin):
    # Three workers, f = 1 (quorum 2) on two shards; a round deadline of 3 s, and workers
    # expire after 1 s without a push. Worker 2 dies after round 0 (it stops, telling
    # nobody): round 1 waits for it until it expires (about 1 s), and then the shards stop
    # waiting for it, so rounds 2 to 4 close as soon as the two others pushed.
    with Shards(2, 3, byzantine=1, aggregator="median", lr=0.5, momentum=0.0, server=server_bin,
                server_args=("--round-deadline-ms", "3000", "--worker-timeout-ms", "1000")) as shards:
        workers = start_workers(shards, 3)
        for w in workers:
            push_round(w, 0, grads(1.0))
        pulled(workers[0], 1)
        start = time.monotonic()
        for w in workers[:2]:
            push_round(w, 1, grads(1.0))
        pulled(workers[0], 2)
        waited = time.monotonic() - start
        assert 0.5 < waited < 2.9, f"round 1 waited {waited:.2f} s: until worker 2 expired"
        start = time.monotonic()
        for round in (2, 3, 4):
            for w in workers[:2]:
                push_round(w, round, grads(1.0))
            pulled(workers[1], round + 1)
        assert time.monotonic() - start < 2.5, "rounds 2-4 waited for the dead worker"
        # Worker 1 leaves (close): one worker is below the quorum, so round 5 cannot close.
        workers[1].close()
        push_round(workers[0], 5, grads(1.0))
        outs = [np.empty(1000, dtype=np.float32), np.empty(10, dtype=np.float32)]
        with pytest.raises(ps_server.Error):
            workers[0].pull_all(6, outs, timeout=1.0)
        # Worker 2 comes back (a new process with its token): it joins at version 5, and
        # its push closes round 5 with the quorum.
        workers[2].close()
        back = ps_server.Worker(shards.addresses, 2, TENSORS, token_file=shards.token_file(2),
                                connect_timeout=30)
        assert back.start_version == 5
        push_round(back, 5, grads(1.0))
        pulled(back, 6)
        # Its predecessor left before round 5: nothing of that round was held for it.
        assert back.stats()["slices_held_from_before"] == 0
        for w in (workers[0], back):
            w.close()


def test_workers_take_the_jobs_slice_size(server_bin):
    # docs/data-plane.md, "The job's slice size": by default the first worker chooses
    # (with a model that gives the shard four slices of 262,144, on loopback large ones
    # unless the machine is loaded) and registers its size, a worker naming another size
    # is refused naming both, and the next one of the job's size adopts the registered
    # one. A model too small for large slices keeps 65,536.
    big = [("w", 1200000)]
    with Shards(1, 2, aggregator="mean", server=server_bin) as shards:
        first = ps_server.Worker(shards.addresses, 0, big, initial=[np.zeros(1200000, np.float32)],
                                 token_file=shards.token_file(0), connect_timeout=30)
        chosen = first.slice_elems
        assert chosen in (262144, 65536)
        other = 65536 if chosen == 262144 else 262144
        with pytest.raises(ps_server.Refused,
                           match=f"slices of {other} elements by the worker, of {chosen} by "
                                 "the shard") as refused:
            ps_server.Worker(shards.addresses, 1, big, slice_elems=other,
                             token_file=shards.token_file(1), connect_timeout=30)
        assert refused.value.reason == "layout_mismatch"
        second = ps_server.Worker(shards.addresses, 1, big, token_file=shards.token_file(1),
                                  connect_timeout=30)
        assert second.slice_elems == chosen
        second.close()
        first.close()
    with Shards(1, 1, aggregator="mean", server=server_bin) as shards:
        small = start_workers(shards, 1)[0]
        assert small.slice_elems == 65536
        small.close()
