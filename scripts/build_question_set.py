"""Writes `eagle3/assets/questions.jsonl.gz`: prompt-only chat data as users have it.

Usage:
    python scripts/build_question_set.py            # 1,000 questions (the shipped file)
    python scripts/build_question_set.py --count 200 --out /tmp/q.jsonl.gz

Each record is `{"id": "q0000", "messages": [{"role": "user", "content": ...}]}` (every tenth with
a short system turn first): a file of questions with no answers, the shape `dataset=files
dataset.track=prompt_only` regenerates through a real target (`experiment=smollm2`). The
questions are general-knowledge, how-to, writing, maths and coding asks built from templates
and topic lists with a fixed seed, so the file is the same on every machine and carries no
answers written by another model.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

ASSET = Path(__file__).resolve().parents[1] / "eagle3" / "assets" / "questions.jsonl.gz"

COUNTRIES = ["France", "Japan", "Brazil", "Kenya", "Canada", "India", "Norway", "Egypt", "Mexico", "Australia",
             "Italy", "Vietnam", "Chile", "Morocco", "Germany", "Peru", "Thailand", "Spain", "Ghana", "Poland"]
SCIENCE = ["photosynthesis", "gravity", "the water cycle", "plate tectonics", "DNA replication", "black holes",
           "vaccines", "the greenhouse effect", "electric current", "evolution by natural selection",
           "the speed of light", "magnetism", "cell division", "sound waves", "the immune system",
           "chemical bonds", "the phases of the Moon", "volcanoes", "rainbows", "antibiotics"]
SKILLS = ["bake bread", "change a bicycle tyre", "start running", "learn a new language", "save money each month",
          "write a cover letter", "plant tomatoes", "prepare for a job interview", "sleep better", "make coffee",
          "organise a small event", "study for an exam", "clean a laptop keyboard", "give a short speech",
          "start a vegetable garden", "keep a journal", "meditate", "cook rice", "paint a room", "learn to swim"]
THINGS = ["the ocean", "autumn leaves", "a quiet library", "a city at night", "a mountain lake", "an old clock",
          "the first snow", "a busy market", "a lighthouse", "a cup of tea", "a summer storm", "a train journey",
          "a forest path", "the night sky", "a small cat", "a garden in spring", "an empty beach", "a candle",
          "a river", "a kite"]
CONCEPTS = ["inflation", "compound interest", "supply and demand", "democracy", "machine learning", "recycling",
            "renewable energy", "the internet", "a budget", "climate", "a healthy diet", "time zones",
            "a credit score", "encryption", "a carbon footprint", "public transport", "a library card",
            "a vaccine trial", "an election", "a museum"]
CODE_TASKS = ["reverses a string", "checks whether a number is prime", "sums a list of numbers",
              "counts the vowels in a word", "finds the largest item in a list", "converts Celsius to Fahrenheit",
              "removes duplicates from a list", "checks whether a word is a palindrome",
              "returns the factorial of n", "merges two sorted lists", "counts words in a sentence",
              "returns the n-th Fibonacci number", "capitalises every word", "finds the average of numbers",
              "sorts a list of names"]
LANGUAGES = ["Python", "JavaScript", "Python", "Go", "Python", "Rust", "Java"]

TEMPLATES = [
    ("What is the capital of {country}?", {"country": COUNTRIES}),
    ("Tell me three facts about {country}.", {"country": COUNTRIES}),
    ("What language is spoken in {country}?", {"country": COUNTRIES}),
    ("Explain {science} in simple terms.", {"science": SCIENCE}),
    ("Why is {science} important?", {"science": SCIENCE}),
    ("Give a short summary of {science} for a ten-year-old.", {"science": SCIENCE}),
    ("How do I {skill}?", {"skill": SKILLS}),
    ("What are some tips to {skill}?", {"skill": SKILLS}),
    ("List the steps to {skill}.", {"skill": SKILLS}),
    ("Write a short poem about {thing}.", {"thing": THINGS}),
    ("Describe {thing} in two sentences.", {"thing": THINGS}),
    ("Write a haiku about {thing}.", {"thing": THINGS}),
    ("What is {concept}?", {"concept": CONCEPTS}),
    ("Explain {concept} to a beginner.", {"concept": CONCEPTS}),
    ("What are the pros and cons of {concept}?", {"concept": CONCEPTS}),
    ("Write a {language} function that {task}.", {"language": LANGUAGES, "task": CODE_TASKS}),
    ("What is {a} plus {b}?", {"a": [str(n) for n in range(2, 60)], "b": [str(n) for n in range(3, 40)]}),
    ("What is {a} times {b}?", {"a": [str(n) for n in range(2, 13)], "b": [str(n) for n in range(2, 13)]}),
    ("If I have {a} apples and eat {b}, how many are left?",
     {"a": [str(n) for n in range(10, 30)], "b": [str(n) for n in range(1, 10)]}),
    ("Compare {country} and {other} in a few sentences.", {"country": COUNTRIES, "other": COUNTRIES}),
]
SYSTEM_PROMPTS = ["You are a concise assistant.", "Answer briefly and clearly.",
                  "You are a friendly teacher.", "Keep answers short."]


def questions(count: int, seed: int = 0) -> list[dict]:
    """`count` distinct question records, cycling through the templates in a seeded order."""
    rng = random.Random(seed)
    seen: set[str] = set()
    records: list[dict] = []
    attempts = 0
    while len(records) < count:
        attempts += 1
        if attempts > count * 200:
            raise SystemExit(f"only {len(records)} distinct questions from the templates; ask for fewer")
        template, slots = TEMPLATES[len(records) % len(TEMPLATES)] if attempts % 7 else rng.choice(TEMPLATES)
        values = {name: rng.choice(options) for name, options in slots.items()}
        if values.get("country") is not None and values.get("country") == values.get("other"):
            continue
        text = template.format(**values)
        if text in seen:
            continue
        seen.add(text)
        messages = [{"role": "user", "content": text}]
        if len(records) % 10 == 9:
            messages.insert(0, {"role": "system", "content": SYSTEM_PROMPTS[len(records) % len(SYSTEM_PROMPTS)]})
        records.append({"id": f"q{len(records):04d}", "messages": messages})
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ASSET)
    args = parser.parse_args()
    rows = questions(args.count, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(args.out, "wb", mtime=0) as fh:  # mtime=0: the same bytes on every rebuild
        fh.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())
    print(f"{args.out}: {len(rows)} questions")


if __name__ == "__main__":
    main()
