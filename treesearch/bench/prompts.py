"""Every prompt the `branch` and `tree` workloads send, in one place (prompts are data).

branch: one reasoning prompt per question (sampled B times), then a verification suffix appended to
each branch's own context (prompt + reasoning), scored over the labels " yes" / " no" at the next
token. The verification prompt extends the branch's context, so with KV sharing it reuses it.

tree (GSM8K): plan -> execute -> reflect, each level continuing its parent's text (chain style).
"""

from __future__ import annotations

from treesearch.tasks.datasets import ChoiceItem, MathItem

MATH_PROMPT = """Solve the math word problem. Reason step by step, then finish with "The answer is N."
Question: A baker makes 12 muffins in each batch. She bakes 3 batches and sells 20 muffins. How many muffins are left?
Reasoning: She bakes 12 * 3 = 36 muffins. After selling, 36 - 20 = 16 muffins are left. The answer is 16.
Question: {question}
Reasoning:"""  # noqa: E501  (prompt text: the model sees these lines as they are)

CHOICE_PROMPT = """Answer the multiple-choice question. Reason step by step, then finish with "The answer is (X)."
Question: Which gas do plants take in from the air to make food?
(A) oxygen
(B) nitrogen
(C) carbon dioxide
(D) helium
Reasoning: Plants use carbon dioxide, water and light in photosynthesis. The answer is (C).
Question: {question}
{choices}
Reasoning:"""  # noqa: E501  (prompt text: the model sees these lines as they are)

VERIFY_SUFFIX = "\nIs the reasoning above correct? Reply yes or no.\nReply:"
VERIFY_LABELS = {" yes": 1.0, " no": 0.0}
BRANCH_STOP = ("\nQuestion:", "\n\n")

TREE_PROMPT = """Solve the math word problem in three parts: a plan, the execution of the plan, and a reflection that checks the work and ends with "The answer is N."
Question: Tom has 3 boxes of 8 pencils and gives away 5 pencils. How many pencils does he have?
Plan: Find the total pencils, then subtract the ones given away.
Execute: 3 * 8 = 24 pencils. 24 - 5 = 19 pencils.
Reflect: 3 boxes of 8 is 24, minus 5 is 19. The answer is 19.
Question: {question}
Plan:"""  # noqa: E501  (prompt text: the model sees these lines as they are)
TREE_LEVELS = ("\nExecute:", "\nReflect:")  # text appended to a parent's context to start the next level
TREE_STOP = ("\nExecute:", "\nReflect:", "\nQuestion:", "\nPlan:", "\n\n")


def branch_prompt(item: MathItem | ChoiceItem) -> str:
    """The reasoning prompt of one question."""
    if isinstance(item, MathItem):
        return MATH_PROMPT.format(question=item.question.strip())
    choices = "\n".join(f"({letter}) {text.strip()}" for letter, text in zip(item.letters, item.choices))
    return CHOICE_PROMPT.format(question=item.question.strip(), choices=choices)


def verify_prompt(context: str, reasoning: str) -> str:
    """The scoring prompt of one branch: its whole context, then the yes/no question."""
    return context + reasoning + VERIFY_SUFFIX


def tree_prompt(item: MathItem) -> str:
    return TREE_PROMPT.format(question=item.question.strip())
