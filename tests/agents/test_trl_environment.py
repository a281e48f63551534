"""TRL-style environments run unchanged: the rule telling the two protocols apart, tools from public methods (schemas
as TRL renders them), ``reset(**row)``, the instance pool, ``get_reward`` (sync and async) and ``environments=``, a
``{name: factory}`` dict routed by the ``environment`` column, and the errors (docs/agents.md)."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.agents import EnvStep
from lightning_grpo.agents.trl_environment import TRLEnvironments, is_trl_factory, tool_method_names
from lightning_grpo.config import AgentConfig, SamplingConfig
from lightning_grpo.rollout import AgentSettings, SamplingSettings, sample_rollout
from lightning_grpo.rollout import multi_turn as multi_turn_module
from lightning_grpo.rollout.chat import render_messages
from lightning_grpo.testing.agents import short_turn_model
from tests.rollout.test_multi_turn import _scripted

# ---------------------------------------------------------------- environments written as TRL's docs show them


class Ledger:
    """A bank account: the policy deposits and withdraws; the reward is how close the balance ends to the target."""

    def __init__(self):
        self.balance = 0
        self.target = 0
        self.resets = 0

    def reset(self, question, target):
        self.balance, self.target = 0, int(target)
        self.resets += 1
        return f" Reach {target}."

    def deposit(self, amount: int) -> str:
        """Deposit money into the account.

        Args:
            amount: How much to deposit.

        Returns:
            The new balance.
        """
        self.balance += amount
        return str(self.balance)

    def withdraw(self, amount: int) -> str:
        """Withdraw money from the account.

        Args:
            amount: How much to withdraw.
        """
        self.balance -= amount
        return str(self.balance)

    def get_reward(self) -> float:
        return 1.0 if self.balance == self.target else 0.0

    def _audit(self) -> None:  # private: not a tool
        pass


class AsyncCounter:
    """An async environment: an async tool and an async get_reward; reset(**kwargs) receives every column."""

    def __init__(self):
        self.count, self.seen = 0, {}

    def reset(self, **kwargs):
        self.count, self.seen = 0, kwargs
        return None

    async def bump(self, by: int) -> int:
        """Increase the counter.

        Args:
            by: The increment.
        """
        await asyncio.sleep(0)
        self.count += by
        return self.count

    async def get_reward(self) -> float:
        await asyncio.sleep(0)
        return float(self.count)


class Echo:
    """Owns no reward: reward functions read it through environments=."""

    def __init__(self):
        self.said = []

    def reset(self, **kwargs):
        self.said = []
        return "Say something."

    def say(self, text: str) -> str:
        """Say a text.

        Args:
            text: What to say.
        """
        self.said.append(text)
        return text


def _call(name, arguments):
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def _rollout(tokenizer, monkeypatch, factory, prompts, columns, script, *, g=2, tools=None):
    monkeypatch.setattr(multi_turn_module, "sample_tokens", _scripted(tokenizer, script))
    agent = AgentSettings.build(tokenizer, environment_factory=factory, tools=tools, max_turns=3, tool_timeout=2.0)
    settings = SamplingSettings(g, 400)
    rollout = sample_rollout(
        torch.nn.Linear(1, 1), tokenizer, prompts, settings, agent, max_prompt_length=4000, columns=columns
    )
    return rollout, agent


PROMPTS = [[{"role": "user", "content": "Balance the ledger."}], [{"role": "user", "content": "Again."}]]


# ---------------------------------------------------------------- the rule


def test_the_rule_telling_the_protocols_apart():
    class Ours:
        def __init__(self, row=None):  # a default row does not make it TRL-style: it has step()
            self.row = row

        def reset(self):
            return None

        def step(self, message):
            return EnvStep(done=True)

    assert not is_trl_factory(Ours)
    assert not is_trl_factory(lambda row: Ours(row))  # a factory that takes the row is ours
    assert is_trl_factory(Ledger) and is_trl_factory(lambda: Ledger()) and is_trl_factory({"a": Ledger})

    class TRLWithDefault:  # no step(): TRL-style, called with no argument even though it could take one
        def __init__(self, row=None):
            self.row = row

        def reset(self, **kwargs):
            return None

    assert is_trl_factory(TRLWithDefault)
    environments = TRLEnvironments(TRLWithDefault)
    assert environments.draw(None).row is None


def test_tools_are_the_public_methods_with_their_schemas(tokenizer):
    from transformers.utils import get_json_schema

    environments = TRLEnvironments(Ledger)
    instance = environments.draw(None)
    tools = environments.toolset(instance)
    assert tool_method_names(Ledger) == ["deposit", "withdraw"]  # reset, get_reward and _private are not tools
    assert tools.names == ["deposit", "withdraw"]
    assert tools.schemas == [get_json_schema(instance.deposit), get_json_schema(instance.withdraw)]
    tools["deposit"].function(amount=5)
    assert instance.balance == 5  # bound to the instance that serves the trajectory


def test_schemas_and_rendered_prompts_equal_trls_own():
    """The same classes give the tool lists TRL's GRPOTrainer builds, rendered into the same prompt text."""
    pytest.importorskip("trl")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    from lightning_grpo.testing import build_tiny_tokenizer
    from lightning_grpo.testing.tiny_model import build_tiny_model

    tokenizer = build_tiny_tokenizer()
    tokenizer.response_template = "unused"  # TRL asks for a response parser; sampling is never run here
    args = TRLConfig(output_dir="/tmp/lg-trl-schema", max_steps=1, per_device_train_batch_size=2, num_generations=2,
                     report_to=[], use_cpu=True)  # fmt: skip
    data = Dataset.from_list([{"prompt": PROMPTS[0], "environment": "ledger", "target": 1, "question": "q"}] * 2)
    factories = {"ledger": Ledger, "echo": Echo}
    trainer = GRPOTrainer(model=build_tiny_model(tokenizer), reward_funcs=[], args=args, processing_class=tokenizer,
                          environment_factory=factories, train_dataset=data)  # fmt: skip
    ours = TRLEnvironments(factories)
    assert trainer.reward_func_names == [cls.__name__ for cls in ours.reward_classes] == ["Ledger"]
    for name in factories:
        theirs = trainer._env_tools[name]  # TRL's tools of this environment: bound methods of its probe instance
        mine = ours.toolset(ours.draw(name))
        assert mine.names == [tool.__name__ for tool in theirs]
        expected = tokenizer.apply_chat_template(PROMPTS[0], tools=theirs, tokenize=False, add_generation_prompt=True)
        assert render_messages(tokenizer, PROMPTS[0], tools=mine.schemas) == expected


# ---------------------------------------------------------------- in a rollout


def test_a_trl_environment_runs_reset_tools_and_rewards(tokenizer, monkeypatch):
    def script(context: str) -> str:
        if "T:\n" in context:
            return "done"
        return _call("deposit", '{"amount": 3}') if "Reach 3" in context else _call("withdraw", '{"amount": 1}')

    columns = {"question": ["q1", "q2"], "target": [3, 1], "dataset_index": [10, 11]}
    rollout, agent = _rollout(tokenizer, monkeypatch, Ledger, PROMPTS, columns, script)
    # reset's string is appended to the last user message; reset(question, target) got only its columns
    assert rollout.prompts[0][-1]["content"] == "Balance the ledger. Reach 3."
    assert rollout.prompts[2][-1]["content"] == "Again. Reach 1."
    environments = rollout.columns["environments"]
    assert len(environments) == 4 and len({id(e) for e in environments}) == 4  # one instance per trajectory
    assert [e.balance for e in environments] == [3, 3, -1, -1]
    assert rollout.completions[0][1] == {"role": "tool", "name": "deposit", "content": "3"}
    # the pool: a second batch reuses the same instances, reset again
    again = sample_rollout(torch.nn.Linear(1, 1), tokenizer, PROMPTS, SamplingSettings(2, 400), agent,
                           max_prompt_length=4000, columns=columns)  # fmt: skip
    assert [id(e) for e in again.columns["environments"]] == [id(e) for e in environments]
    assert [e.resets for e in environments] == [2, 2, 2, 2]
    reward = agent.trl_environments.reward_functions()["Ledger"]
    assert reward(environments=environments) == [1.0, 1.0, 0.0, 0.0]


def test_rows_without_a_prompt_take_it_from_reset(tokenizer, monkeypatch):
    class Task:
        def reset(self, task):
            return f"Solve {task}."

        def noop(self) -> str:
            """Do nothing."""
            return ""

    rollout, _ = _rollout(tokenizer, monkeypatch, Task, [[], []], {"task": ["a", "b"]}, lambda context: "ok")
    assert rollout.prompts[0] == [{"role": "user", "content": "Solve a."}]
    assert rollout.prompts[3] == [{"role": "user", "content": "Solve b."}]


def test_a_dict_routes_rows_and_offers_only_that_environments_tools(tokenizer, monkeypatch):
    offered = []

    def script(context: str) -> str:
        offered.append(context)
        if "T:\n" in context:
            return "done"
        return _call("say", '{"text": "hi"}') if "Say something" in context else _call("bump", '{"by": 2}')

    factories = {"echo": Echo, "counter": AsyncCounter}
    columns = {"environment": ["echo", "counter"], "level": [1, 2]}
    rollout, agent = _rollout(tokenizer, monkeypatch, factories, PROMPTS, columns, script)
    first = [c for c in offered if "T:\n" not in c]
    assert all("say" in c and "bump" not in c for c in first if "Say something" in c)
    assert all("bump" in c and "say" not in c for c in first if "Say something" not in c)
    environments = rollout.columns["environments"]
    assert [type(e).__name__ for e in environments] == ["Echo", "Echo", "AsyncCounter", "AsyncCounter"]
    assert environments[0].said == ["hi"] and environments[2].count == 2
    assert environments[2].seen == {"prompt": PROMPTS[1], "level": 2}  # no 'environment', no internal columns
    rewards = agent.trl_environments.reward_functions()
    assert list(rewards) == ["AsyncCounter"]  # Echo owns no reward
    assert asyncio.run(rewards["AsyncCounter"](environments=environments)) == [None, None, 2.0, 2.0]


def test_bad_trl_environments_get_clear_errors(tokenizer, monkeypatch):
    class NoReset:
        def act(self) -> str:
            """Act."""
            return ""

    with pytest.raises(ValueError, match=r"NoReset, which has no reset\(\) method"):
        TRLEnvironments(NoReset)
    with pytest.raises(ValueError, match=r"environment='nope'.*expected one of \['echo', 'counter'\]"):
        _rollout(tokenizer, monkeypatch, {"echo": Echo, "counter": AsyncCounter}, PROMPTS,
                 {"environment": ["echo", "nope"]}, lambda c: "x")  # fmt: skip
    with pytest.raises(ValueError, match="has no 'environment' column"):
        _rollout(tokenizer, monkeypatch, {"echo": Echo}, PROMPTS, {}, lambda c: "x")

    class BadReward(Echo):
        def get_reward(self):
            return "high"

    rewards = TRLEnvironments(BadReward).reward_functions()
    with pytest.raises(TypeError, match=r"BadReward.get_reward\(\) returned 'high'; it must return a number"):
        rewards["BadReward"](environments=[BadReward()])
    with pytest.raises(ValueError, match=r"Ledger.reset\(\) cannot be called with the row's columns"):
        _rollout(tokenizer, monkeypatch, Ledger, PROMPTS, {"question": ["a", "b"]}, lambda c: "x")


# ---------------------------------------------------------------- in the module


def test_get_reward_may_be_the_only_reward_and_reward_functions_see_environments(tokenizer):
    seen = []

    def said_hi(completions, environments, **_):
        seen.append(list(environments))
        return [float(e.said == ["hi"]) for e in environments]

    grpo = GRPOConfig(
        sampling=SamplingConfig(num_generations=2, max_new_tokens=24, max_prompt_length=600),
        agents=AgentConfig(max_turns=2),
    )
    model = short_turn_model(tokenizer)
    module = GRPOModule(model, tokenizer=tokenizer, policy=PolicyConfig(lora_r=4, lora_alpha=8),
                        grpo=grpo, environment_factory=Ledger)  # fmt: skip
    assert module.rewards.names == ("Ledger",) and module.rewards.weights == (1.0,)
    batch = {"prompt": PROMPTS, "question": ["a", "b"], "target": [0, 5]}
    torch.manual_seed(0)
    rollout = module.generate(batch)
    scores = module.score(rollout)
    assert scores.rewards.tolist() == [1.0, 1.0, 0.0, 0.0]  # the random policy deposits nothing: balance 0
    both = GRPOModule(model, [said_hi], reward_weights=[0.5], tokenizer=tokenizer, grpo=grpo,
                      policy=PolicyConfig(lora_r=4, lora_alpha=8), environment_factory={"echo": Echo})  # fmt: skip
    assert both.rewards.names == ("said_hi",) and both.rewards.weights == (0.5,)  # Echo owns no reward
    both.score(both.generate({"prompt": PROMPTS, "environment": ["echo", "echo"]}))
    assert len(seen[0]) == 4 and all(isinstance(e, Echo) for e in seen[0])


def test_a_tool_named_twice_is_refused(tokenizer):
    def deposit(amount: int) -> str:
        """Deposit.

        Args:
            amount: How much.
        """
        return ""

    with pytest.raises(ValueError, match="Two tools are named 'deposit'"):  # found when the module is built
        AgentSettings.build(tokenizer, tools=[deposit], environment_factory=Ledger)


def test_a_class_without_step_that_needs_an_argument_is_told_which_protocol_it_fell_under():
    class NeedsRow:
        def __init__(self, row):
            self.row = row

        def reset(self):
            return None

    with pytest.raises(TypeError, match=r"has no step\(\) method, so it is a TRL-style environment"):
        TRLEnvironments(NeedsRow)


def test_a_fit_with_a_trl_environment_dict_and_batches_without_prompts(tokenizer):
    from tests.conftest import make_trainer

    class Task(Echo):
        def reset(self, topic):
            self.said = []
            return f"Talk about {topic}."

    def said(environments, prompts, **_):
        assert all(p[-1]["content"].startswith("Talk about ") for p in prompts)  # the prompt came from reset alone
        return [float(len(e.said)) for e in environments]

    grpo = GRPOConfig(
        sampling=SamplingConfig(num_generations=2, max_new_tokens=16, max_prompt_length=600),
        agents=AgentConfig(max_turns=2),
    )
    module = GRPOModule(short_turn_model(tokenizer), [said], tokenizer=tokenizer, environment_factory={"task": Task},
                        policy=PolicyConfig(lora_r=4, lora_alpha=8), grpo=grpo)  # fmt: skip
    batch = {"environment": ["task", "task"], "topic": ["cats", "dogs"]}  # no "prompt": reset writes it
    loader = torch.utils.data.DataLoader([batch], batch_size=None)
    make_trainer(max_steps=1).fit(module, loader)
    assert module.global_step == 1
