"""Two request workloads for prefix caching (notebook 18), as SmolLM2 token ids.

- `multi_turn_chat(tokenizer)`: conversations in SmolLM2's chat template; each turn's prompt
  is the whole conversation so far, so it starts with the previous turn's prompt and reply.
  The assistant turns are fixed text (a replayed log), each ending with <|im_end|>.
- `few_shot(tokenizer)`: three tasks, each a fixed instruction with worked examples followed
  by one new query; the requests of a task share everything up to the query.

Both return `prefix_replay.ReplayRequest`s, and `interleave` mixes groups of requests
round-robin (the order in which they reach a server).
"""
from __future__ import annotations

from ..serving.prefix_replay import ReplayRequest

CONVERSATIONS = [
    [("What is the capital of France?", "The capital of France is Paris."),
     ("How many people live there?", "About two million people live in the city of Paris itself."),
     ("Name one famous museum in it.", "The Louvre, home of the Mona Lisa."),
     ("When was it opened?", "The Louvre opened as a museum in 1793.")],
    [("Give me a word that rhymes with cat.", "Hat rhymes with cat."),
     ("And one with dog?", "Log rhymes with dog."),
     ("Use both words in a sentence.", "The dog slept on a log while the cat wore a hat."),
     ("Make it shorter.", "A dog on a log, a cat in a hat.")],
    [("How do I boil an egg?", "Put the egg in boiling water for about nine minutes."),
     ("What if I want it soft?", "Take it out after six minutes."),
     ("How do I peel it easily?", "Cool it in cold water first, then crack the shell all over."),
     ("Thanks!", "You are welcome. Enjoy your egg!")],
]

FEW_SHOT_TASKS = {
    "sentiment": ("Decide whether each review is positive or negative.\n\n",
                  [("The soup was cold and the waiter was rude.", "negative"),
                   ("A lovely evening, we will come back.", "positive"),
                   ("Too loud, too slow, too expensive.", "negative")],
                  "Review: {}\nSentiment:",
                  [("Fresh bread and friendly staff.", " positive"), ("I waited an hour for a salad.", " negative"),
                   ("Best pizza in town.", " positive"), ("The room smelled of smoke.", " negative")]),
    "capital": ("Give the capital city of each country.\n\n",
                [("Italy", "Rome"), ("Japan", "Tokyo"), ("Canada", "Ottawa"), ("Egypt", "Cairo")],
                "Country: {}\nCapital:",
                [("Spain", " Madrid"), ("Kenya", " Nairobi"), ("Peru", " Lima"), ("Norway", " Oslo")]),
    "plural": ("Write the plural of each English noun.\n\n",
               [("child", "children"), ("mouse", "mice"), ("box", "boxes")],
               "Noun: {}\nPlural:",
               [("tooth", " teeth"), ("city", " cities"), ("leaf", " leaves"), ("goose", " geese")]),
}


def multi_turn_chat(tokenizer, conversations=CONVERSATIONS) -> list:
    """One group of requests per conversation, turn after turn: [[ReplayRequest, ...], ...].

    Turn t's prompt is encode_chat(every earlier message + user message t); its output is the
    reply's tokens and <|im_end|>. Checks that each prompt starts with the previous turn's
    prompt + output (so the conversation really is a growing prefix)."""
    end = tokenizer.encode("<|im_end|>")
    groups = []
    for c, turns in enumerate(conversations):
        messages, group, previous = [], [], None
        for t, (user, reply) in enumerate(turns):
            messages.append({"role": "user", "content": user})
            prompt = tokenizer.encode_chat(messages)
            output = tokenizer.encode(reply) + end
            if previous is not None and list(prompt[:len(previous)]) != list(previous):
                raise ValueError(f"conversation {c}, turn {t}: the prompt does not extend the previous turn")
            group.append(ReplayRequest(f"chat {c} turn {t}", prompt, output))
            previous = list(prompt) + list(output)
            messages.append({"role": "assistant", "content": reply})
        groups.append(group)
    return groups


def few_shot(tokenizer, tasks=FEW_SHOT_TASKS) -> list:
    """One group of requests per task: the instruction, the worked examples, then one query
    each (output: the expected answer's tokens)."""
    groups = []
    for task, (instruction, examples, pattern, queries) in tasks.items():
        shots = "".join(pattern.format(q) + " " + a + "\n\n" for q, a in examples)
        group = [ReplayRequest(f"{task} {i}", tokenizer.encode(instruction + shots + pattern.format(q)),
                               tokenizer.encode(a)) for i, (q, a) in enumerate(queries)]
        groups.append(group)
    return groups


def interleave(groups) -> list:
    """Round-robin over the groups: g0[0], g1[0], g2[0], g0[1], ... (arrival order)."""
    out, longest = [], max((len(g) for g in groups), default=0)
    for i in range(longest):
        out.extend(g[i] for g in groups if i < len(g))
    return out
