"""The README's "Using privet in your own Flower app" snippet runs as written, with privet's ClientApp."""

from __future__ import annotations

import re
import types

from tests.flower_processes import APP_DIR


def test_the_readme_serverapp_runs_and_every_client_stays_within_its_budget(run_config_factory, capsys):
    from flwr.app import Context, RecordDict

    import privet
    from privet.inprocess import InProcessGrid

    readme = (APP_DIR / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", readme, re.DOTALL) if "ServerApp()" in b]
    assert len(blocks) == 1, "the README shows one ServerApp"
    module = types.ModuleType("readme_app")
    exec(compile(blocks[0], "README.md", "exec"), module.__dict__)  # noqa: S102 - the README's own code

    run_config = run_config_factory(max_examples_per_client=64, num_clients=3, model="cnn")  # the README's model
    budgets = [0.5, 3.0, 8.0]
    nodes = [{"partition-id": i, "num-partitions": 3, "client-id": f"org-{i}", "epsilon": eps}
             for i, eps in enumerate(budgets)]
    grid = InProcessGrid(privet.client_app, nodes, run_config)
    module.app(grid=grid, context=Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                          run_config=run_config))

    printed = dict(line.split(" ", 1) for line in capsys.readouterr().out.splitlines() if line.startswith("org-"))
    assert set(printed) == {"org-0", "org-1", "org-2"}
    for i, eps in enumerate(budgets):
        spent, budget = map(float, printed[f"org-{i}"].split())
        assert budget == eps and 0 < spent <= eps
