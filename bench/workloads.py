"""Seeded workload generators for routing and cache benchmarks.

A workload is a list of sessions; a session is a system prompt and the user
turns of one conversation. A runner sends turn k with the system prompt, the
earlier user turns and the assistant's real replies so far, so every turn's
prompt extends the previous turn's prompt plus its answer: exactly the prefix
reuse a cache-aware router should keep on one engine.

    petcare_chat        multi-turn sessions sharing a few system prompts: the
                        pet-care companion of our first users (a system prompt,
                        a dog's profile, a growing conversation)
    long_document_qa    several questions, each in its own session, about each
                        of a few long documents
    no_shared_prefix    single-turn prompts that share nothing (the worst case
                        for any cache; routing cannot help)

Same seed, same workload: every choice comes from one random.Random(seed).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class Session:
    session_id: str
    system: str
    user_turns: list[str]
    max_tokens: int = 16
    replies: list[str] = field(default_factory=list)

    @property
    def num_turns(self) -> int:
        return len(self.user_turns)

    def messages(self, turn: int) -> list[dict]:
        """The chat messages of turn `turn` (0-based): needs replies[:turn]."""
        if turn > len(self.replies):
            raise ValueError(f"turn {turn} needs the replies of turns 0..{turn - 1}; have {len(self.replies)}")
        messages = [{"role": "system", "content": self.system}]
        for k in range(turn):
            messages += [{"role": "user", "content": self.user_turns[k]},
                         {"role": "assistant", "content": self.replies[k]}]
        messages.append({"role": "user", "content": self.user_turns[turn]})
        return messages


@dataclass(slots=True)
class Workload:
    name: str
    sessions: list[Session]

    @property
    def num_requests(self) -> int:
        return sum(s.num_turns for s in self.sessions)

    def fresh(self) -> "Workload":
        """The same sessions with no replies recorded (to run it again)."""
        return Workload(self.name, [Session(s.session_id, s.system, list(s.user_turns), s.max_tokens)
                                    for s in self.sessions])


PETCARE_SYSTEM_PROMPTS = [
    "You are Pawly, a friendly pet-care companion. Answer questions about dogs and cats kindly and briefly. "
    "Always suggest a visit to the vet when symptoms sound serious. Never recommend human medicine for pets.",
    "You are a veterinary nurse assistant for a small-animal clinic. Give practical, safe advice on feeding, "
    "grooming, exercise and training. Keep answers short and ask one follow-up question when unsure.",
    "You are a dog trainer's helper. Explain positive-reinforcement training step by step, with treats and "
    "praise, and adapt every tip to the dog's age, breed and energy level described in the profile.",
]
_NAMES = ["Rex", "Bella", "Max", "Luna", "Charlie", "Daisy", "Milo", "Coco", "Rocky", "Ruby", "Buddy", "Rosie"]
_BREEDS = ["beagle", "labrador", "poodle", "border collie", "dachshund", "golden retriever", "pug", "boxer"]
_TRAITS = ["loves long walks", "is afraid of thunder", "pulls on the leash", "barks at the doorbell",
           "has a sensitive stomach", "chews shoes", "is very shy with strangers", "has itchy skin"]
_QUESTIONS = [
    "How often should I feed {name}?", "How much exercise does {name} need each day?",
    "{name} is scratching a lot lately. What could it be?", "What treats are safe for {name}?",
    "How do I teach {name} to come when called?", "Is it normal that {name} sleeps most of the afternoon?",
    "How often should I brush {name}'s teeth?", "{name} ate some grass. Should I worry?",
    "What is a good bedtime routine for {name}?", "How can I help {name} stay calm during storms?",
    "When should {name} get the next vaccination?", "How do I trim {name}'s nails safely?",
]


_DETAILS = [
    "We live in a small flat with a park nearby and I work from home most days.",
    "Last week the vet said everything looked fine, but I still want to be careful.",
    "Our neighbour's dog visits sometimes and they play in the garden for an hour.",
    "We usually walk twice a day, once early in the morning and once after dinner.",
    "My kids like to give treats when I am not looking, which worries me a bit.",
    "The food we buy is a dry kibble for medium breeds, mixed with some wet food.",
]


def petcare_chat(num_sessions: int = 16, turns: int = 4, seed: int = 0, max_tokens: int = 16) -> Workload:
    rng = random.Random(seed)
    sessions = []
    for i in range(num_sessions):
        name = rng.choice(_NAMES)
        profile = (f"Dog profile: {name}, a {rng.randint(1, 14)} year old {rng.choice(_BREEDS)} weighing "
                   f"{rng.randint(4, 40)} kg who {rng.choice(_TRAITS)} and {rng.choice(_TRAITS)}.")
        system = rng.choice(PETCARE_SYSTEM_PROMPTS) + "\n" + profile
        # Each turn carries a detail sentence, as real users write: the conversation,
        # not the shared system prompt, makes up most of a late turn's prompt.
        questions = [q.format(name=name) + " " + rng.choice(_DETAILS) for q in rng.sample(_QUESTIONS, turns)]
        sessions.append(Session(f"petcare-{i}", system, questions, max_tokens))
    return Workload("petcare_chat", sessions)


_WORDS = ("dog cat puppy kitten food water walk park vet bowl leash collar bed toy ball treat brush "
          "coat paw tail ear nose tooth grooming training sleep play rest morning evening meal bath "
          "health weight breed owner garden house window door blanket crate routine calm energy").split()


def _document(rng: random.Random, num_sentences: int) -> str:
    sentences = []
    for _ in range(num_sentences):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 12))]
        sentences.append(" ".join(words).capitalize() + ".")
    return " ".join(sentences)


def long_document_qa(num_documents: int = 4, questions_per_document: int = 4, sentences: int = 40,
                     seed: int = 0, max_tokens: int = 16) -> Workload:
    rng = random.Random(seed)
    sessions = []
    for d in range(num_documents):
        document = _document(rng, sentences)
        system = f"Answer questions about this care guide.\n\nGuide {d}:\n{document}"
        for q in range(questions_per_document):
            question = f"What does the guide say about the {rng.choice(_WORDS)} and the {rng.choice(_WORDS)}?"
            sessions.append(Session(f"doc-{d}-q{q}", system, [question], max_tokens))
    rng.shuffle(sessions)  # questions about one document arrive interleaved with others
    return Workload("long_document_qa", sessions)


def no_shared_prefix(num_prompts: int = 32, sentences: int = 6, seed: int = 0, max_tokens: int = 16) -> Workload:
    rng = random.Random(seed)
    sessions = [Session(f"unique-{i}", f"Request {i} {rng.getrandbits(64):x}. " + _document(rng, sentences),
                        ["Summarize."], max_tokens) for i in range(num_prompts)]
    return Workload("no_shared_prefix", sessions)


WORKLOADS = {"petcare_chat": petcare_chat, "long_document_qa": long_document_qa, "no_shared_prefix": no_shared_prefix}
