"""Hosted models as all three MathChat agents, scored by an LLM coach (both via litellm).

Run:  GEMINI_API_KEY=... python examples/api_agents.py [model]
      (or OPENAI_API_KEY / ANTHROPIC_API_KEY with e.g. openai/gpt-4o-mini)

Without a key it says what to set and exits. Any litellm model id works, and so does a
local OpenAI-compatible server: "openai/<name>" with OPENAI_API_BASE pointing at it.
"""

from __future__ import annotations

import os
import sys

import mappa_env
from mappa_agents import AgentSystem, RolloutRunner, SamplingParams
from mappa_agents.report import format_table, summarize
from mappa_env.coach import make_coach

KEYS = ("GEMINI_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_BASE")


def main() -> int:
    if not any(os.environ.get(k) for k in KEYS):
        print(f"Set one of {', '.join(KEYS)} to run this example.")
        return 0
    model = sys.argv[1] if len(sys.argv) > 1 else "gemini/gemini-2.5-flash"
    agents = ["problem_solver", "code_executor", "verifier"]
    system = AgentSystem.from_spec(f"api:{model}", agents)
    coach = make_coach(f"llm:{model}?cache=runs/api_example/coach.sqlite")
    runner = RolloutRunner(
        lambda: mappa_env.make("MathChat-v0", tasks="gen:8", coach=coach),
        system,
        SamplingParams(max_new_tokens=2048, temperature=0.6),
        concurrency=8,
    )
    episodes = runner.run(8)
    print(format_table(summarize(episodes)))
    system.close()
    coach.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
