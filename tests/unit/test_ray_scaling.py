"""When sluice on Ray asks the autoscaler for CPUs and gives them back (broker.ray.scaling,
no Ray needed): a floor of the cluster's CPUs plus what waits, renewed upwards while
commands keep waiting, withdrawn (0) once idle."""

from broker.ray.names import executor_name, node_of
from broker.ray.scaling import Scaler


def scaler(**kw):
    return Scaler(**{"wait_s": 5.0, "idle_s": 30.0, "slots_per_cpu": 2, **kw})


def test_nothing_is_asked_until_commands_waited_longer_than_the_threshold():
    s = scaler()
    assert s.observe(0.0, queued=3, busy=6, cluster_cpus=3) is None
    assert s.observe(4.9, queued=3, busy=6, cluster_cpus=3) is None
    request = s.observe(5.0, queued=3, busy=6, cluster_cpus=3)
    assert request is not None and request.cpus == 3 + 2  # 3 waiting, 2 per CPU
    assert "3 command(s) waited more than 5 s" in request.why
    assert s.current == request


def test_a_queue_that_empties_before_the_threshold_restarts_the_clock():
    s = scaler()
    s.observe(0.0, queued=1, busy=2, cluster_cpus=1)
    s.observe(4.0, queued=0, busy=2, cluster_cpus=1)
    assert s.observe(6.0, queued=1, busy=2, cluster_cpus=1) is None
    assert s.observe(11.0, queued=1, busy=2, cluster_cpus=1).cpus == 2


def test_the_request_grows_while_commands_keep_waiting_and_never_shrinks_meanwhile():
    s = scaler()
    s.observe(0.0, queued=4, busy=2, cluster_cpus=1)
    assert s.observe(5.0, queued=4, busy=2, cluster_cpus=1).cpus == 3
    assert s.observe(6.0, queued=2, busy=2, cluster_cpus=1) is None  # less wanted: the floor stays
    assert s.observe(7.0, queued=4, busy=6, cluster_cpus=3).cpus == 5  # nodes came, work still waits


def test_max_cpus_caps_the_request():
    s = scaler(max_cpus=4)
    s.observe(0.0, queued=100, busy=2, cluster_cpus=1)
    assert s.observe(5.0, queued=100, busy=2, cluster_cpus=1).cpus == 4
    assert s.observe(9.0, queued=100, busy=8, cluster_cpus=4) is None


def test_the_request_is_withdrawn_once_idle_long_enough_and_only_once():
    s = scaler()
    s.observe(0.0, queued=2, busy=2, cluster_cpus=1)
    s.observe(5.0, queued=2, busy=2, cluster_cpus=1)
    assert s.observe(10.0, queued=0, busy=1, cluster_cpus=2) is None  # still running: not idle
    assert s.observe(11.0, queued=0, busy=0, cluster_cpus=2) is None
    assert s.observe(40.9, queued=0, busy=0, cluster_cpus=2) is None
    released = s.observe(41.0, queued=0, busy=0, cluster_cpus=2)
    assert released.cpus == 0 and "released" in released.why
    assert s.observe(100.0, queued=0, busy=0, cluster_cpus=2) is None


def test_an_idle_cluster_that_never_asked_asks_nothing():
    s = scaler()
    assert all(s.observe(t, queued=0, busy=0, cluster_cpus=1) is None for t in (0.0, 100.0, 1000.0))
    assert s.current is None


def test_an_executor_name_carries_its_node():
    name = executor_name("10.0.0.7", "61d7535d5a17e27d670a3b48")
    assert name == "ray:10.0.0.7:61d7535d"
    assert node_of(name) == "61d7535d"
    assert node_of("build1:4242") is None and node_of("executor-3") is None
