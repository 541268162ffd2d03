"""The devnet's held-out accuracy: each published policy step measured beside the run, as an operator would."""

from __future__ import annotations

import threading

import httpx

from intellect_protocol.devnet.network import Network


class Accuracy(threading.Thread):
    """Held-out accuracy (mean task reward of greedy completions) of each newly published policy step on the run's
    own environment's held-out problems (:mod:`shared.evaluation`), measured beside the run and posted to the
    coordinator as an operator's evaluation (the leaderboard charts it)."""

    def __init__(self, network: Network, stop: threading.Event, model: str) -> None:
        super().__init__(name="accuracy", daemon=True)
        self.network, self.stop_event, self.model = network, stop, model
        self.by_step: dict[int, float] = {}
        self.tool_calls_by_step: dict[int, float] = {}
        """A multi-turn environment's share of held-out episodes with a correct tool call, by step (else empty)."""
        self.within_budget_by_step: dict[int, float] = {}
        """Under a thinking budget, the share of held-out completions within it, by step (else empty)."""
        self.measured_on = ""
        """What it is measured on, in words (the environment and where its held-out problems come from)."""

    def run(self) -> None:
        from intellect_protocol.shared.evaluation import Stopped

        try:
            self._measure()
        except Stopped:
            pass
        except httpx.HTTPError:
            if not self.stop_event.is_set():
                raise  # once the devnet stops, its coordinator going away is expected, not an error

    def _measure(self) -> None:
        import torch
        import transformers

        from intellect_protocol.shared.environments.length import LengthBudget
        from intellect_protocol.shared.evaluation import HeldOutTask, held_out_metrics
        from intellect_protocol.shared.models import load_model
        from intellect_protocol.shared.run_schemas import RunInfo
        from intellect_protocol.shared.shardcast.origin import step_dir

        torch.set_num_threads(1)
        transformers.utils.logging.disable_progress_bar()  # its bars would tear the live dashboard
        url = f"{self.network.coordinator.url}/v1/public/runs/{self.network.run_id}"
        run = RunInfo.model_validate(self.network.http.get(url, timeout=10).json())
        budget = LengthBudget.model_validate(run.length_budget)
        task = HeldOutTask.of_run(run.environment, run.environment_version, run.prompting, run.sampling.max_tokens, budget)
        self.measured_on = task.describe()
        base, tokenizer = load_model(self.model)
        self._record(0, held_out_metrics(base, tokenizer, task, self.stop_event))
        while not self.stop_event.wait(2):
            url = f"{self.network.coordinator.url}/v1/manifests/{self.network.run_id}/latest"
            reply = self.network.http.get(url, timeout=10)
            step = reply.json()["step"] if reply.status_code == 200 else 0
            if step and step not in self.by_step:
                try:
                    model, _ = load_model(step_dir(self.network.workdir / "origin", self.network.run_id, step))
                except OSError:
                    continue  # retired by the origin between the two reads; the next step comes soon
                self._record(step, held_out_metrics(model, tokenizer, task, self.stop_event))

    def _record(self, step: int, metrics: dict[str, float]) -> None:
        self.by_step[step] = metrics["heldout_accuracy"]
        if "heldout_tool_calls" in metrics:
            self.tool_calls_by_step[step] = metrics["heldout_tool_calls"]
        if "heldout_within_budget" in metrics:
            self.within_budget_by_step[step] = metrics["heldout_within_budget"]
        self.network.http.post(
            f"{self.network.coordinator.url}/v1/admin/runs/{self.network.run_id}/evaluations",
            json={"step": step, "metrics": metrics},
            headers={"authorization": f"Bearer {self.network.token}"},
            timeout=10,
        ).raise_for_status()
