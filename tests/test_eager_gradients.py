"""parallel.data.check_eager_gradients on a one-rank gloo group: a gradient that code Dynamo ran eagerly (after
a graph break) gives a parameter no compiled graph read is averaged over the ranks by a hook (counted), one
a graph read is left to the graph (its gradient checked once to be the same on every rank), and one FSDP cut to its rows fails the backward in one line. That the
average is the global batch's is checked on 2 ranks (tests/test_parallel_data.py, the +break runs)."""
import copy

import pytest
import torch
import torch.fx as fx

from colauto_backend.parallel import data


def _pair():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    return module, copy.deepcopy(module)


def test_eager_gradients_are_averaged_where_no_graph_read_the_parameter(group):
    module, ref = _pair()
    graph_weight = module[0].weight
    compiled = data.check_eager_gradients(module, fx.symbolic_trace(torch.nn.Identity()), lambda *args: args,
                                          [graph_weight])
    compiled(graph_weight)            # a compiled graph's call, reading the first layer's weight
    before, checked = dict(data.EAGER_AVERAGED), sum(data.SAME_CHECKED.values())
    x = torch.randn(5, 3)
    module(x).square().sum().backward()
    ref(x).square().sum().backward()
    for (name, p), q in zip(module.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)   # one rank: the mean is itself
    averaged = {k: v - before.get(k, 0) for k, v in data.EAGER_AVERAGED.items() if v > before.get(k, 0)}
    assert averaged == {"0.bias": 1, "1.weight": 1, "1.bias": 1}, averaged
    # the graph's parameter: its gradient compared across the ranks (one here) at the backward's end, again in
    # each later backward until SAME_CHECKS have found it equal, then no more
    assert sum(data.SAME_CHECKED.values()) - checked == 1
    for _ in range(data.SAME_CHECKS + 1):
        compiled(graph_weight)
        module(x).square().sum().backward()
    assert sum(data.SAME_CHECKED.values()) - checked == data.SAME_CHECKS


def test_an_eager_gradient_of_a_cut_parameter_fails_the_backward_in_one_line(group):
    module, _ = _pair()
    cut = module[1].weight
    data.check_eager_gradients(module, fx.symbolic_trace(torch.nn.Identity()), lambda *args: args, [],
                               cut=lambda p: p is cut)
    with pytest.raises(RuntimeError) as err:
        module(torch.randn(5, 3)).sum().backward()
    message = str(err.value)
    assert message.startswith("colauto: the gradient of 1.weight comes from code that ran outside the compiled "
                              "graphs"), message
    assert "which FSDP cut in place" in message and "\n" not in message
    assert cut.grad is None            # nothing stepped on
