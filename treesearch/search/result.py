"""`SearchResult`: what a search returns (tree, best node, answer, stats), saved and loaded with
a checksum through `treesearch.search.persist`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from treesearch.common.errors import ProblemDefinitionError, SaveFileError
from treesearch.core.problem import Problem, check_text
from treesearch.core.state_json import round_trip_error
from treesearch.core.tree import ThoughtTree
from treesearch.search.stop import StopReason


@dataclass
class SearchResult:
    """What `Searcher.solve` and `Searcher.resume` return, and what an interrupted search leaves on
    its exception as `exc.partial_result` (status "interrupted", error naming the exception).

    `stop_reason` says why a search ended early (every expansion empty, a prompt over the context,
    the strategy's budget spent, an exception...): a `StopReason` with a stable `code` and a
    `message`; None when the search ran to its strategy's end (`treesearch.search.stop`).

    `save(path)` / `SearchResult.load(path, problem)` round-trip everything but the KV handles
    (see `treesearch.search.persist` for the file format and its checks)."""

    tree: ThoughtTree
    best: int | None
    answer: str | None
    solved: bool
    stats: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    status: str = "complete"  # "complete" | "interrupted"; solve_many also "failed" | "invalid"
    error: str | None = None  # repr of the exception that interrupted the search
    problem: Problem | None = field(default=None, repr=False, compare=False)  # converts states on save
    answer_node: int | None = None  # the node `answer` was read from (see Searcher.result); None: no answer
    # why `answer` is not a solution (the problem's `rejection_reason`, asked when not given); None:
    # solved, no answer, or no reason known
    rejection: str | None = None
    worker: str | None = (
        None  # the Ray worker that ran the search (`treesearch.run_distributed`); None: this process
    )
    stop_reason: StopReason | None = None  # why it ended early (treesearch.search.stop); None: ran to its end

    def __post_init__(self) -> None:
        """With the problem: ask it why an unsolved answer is not a solution (`rejection`) and what a
        score means (the tree's meta "score_legend", which the tree views print)."""
        p = self.problem
        if p is None:
            return
        if "score_legend" not in self.tree.meta:
            self.tree.meta["score_legend"] = check_text(p, "score_legend", p.score_legend())
        node = self.answer_node
        if self.rejection is None and node is not None and not self.solved and node in self.tree:
            why = p.rejection_reason(self.tree.node(node)["state"])
            self.rejection = check_text(p, "rejection_reason", why, none=True)

    def to_json(self, problem: Problem | None = None) -> dict:
        problem = problem or self.problem
        conv = problem.state_to_json if problem is not None else None
        return {
            "answer": self.answer,
            "solved": self.solved,
            "best": self.best,
            "answer_node": self.answer_node,
            "rejection": self.rejection,
            "status": self.status,
            "error": self.error,
            "stop_reason": self.stop_reason.to_json() if self.stop_reason is not None else None,
            "stats": self.stats,
            "config": self.config,
            "tree": self.tree.to_json(conv),
        }

    def save(self, path: str | Path, problem: Problem | None = None) -> Path:
        """Write the result to path atomically, with a checksum; states go through the problem's
        `state_to_json` (the problem that produced the result, unless another is given). Every
        state must come back as itself, `state_from_json(state_to_json(s)) == s`, for a resume to
        continue the search: one that does not raises ProblemDefinitionError naming it, and
        nothing is written."""
        from treesearch.search.persist import save_payload

        problem = problem or self.problem
        data = self.to_json(problem)
        if problem is not None:
            for node in data["tree"]["nodes"]:
                why = round_trip_error(
                    problem, node["id"], self.tree.node(node["id"])["state"], node["state"]
                )
                if why is not None:
                    raise ProblemDefinitionError(why)
        return save_payload(path, data)

    @classmethod
    def load(cls, path: str | Path, problem: Problem | None = None) -> SearchResult:
        """Read a saved result; with the problem, states are rebuilt by its `state_from_json` (needed
        to resume). A truncated, edited or damaged file raises SaveFileError and loads nothing."""
        from treesearch.search.persist import load_payload

        r = load_payload(path)
        tree = ThoughtTree.from_json(r["tree"], problem.state_from_json if problem is not None else None)
        if r["best"] is not None and r["best"] not in tree:
            raise SaveFileError(f"{path}: best node {r['best']} is not in the saved tree; nothing was loaded")
        # files from before answer_node read their answer from best
        answer_node = r.get("answer_node", r["best"] if r["answer"] is not None else None)
        if answer_node is not None and (isinstance(answer_node, bool) or answer_node not in tree):
            raise SaveFileError(
                f"{path}: answer node {answer_node!r:.20} is not in the saved tree; nothing was loaded"
            )
        rejection = r.get("rejection")  # files from before the field have none
        if rejection is not None and not isinstance(rejection, str):
            raise SaveFileError(f"{path}: field 'rejection' is {rejection!r:.40}; nothing was loaded")
        return cls(
            tree=tree,
            best=r["best"],
            answer=r["answer"],
            solved=r["solved"],
            stats=r["stats"],
            config=r["config"],
            status=r["status"],
            error=r["error"],
            problem=problem,
            answer_node=answer_node,
            stop_reason=StopReason.from_json(r.get("stop_reason")),  # files from before it: None
            rejection=rejection,
        )
