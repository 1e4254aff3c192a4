"""Tiny conversations written for the tests (never a slice of a benchmark)."""

from __future__ import annotations

import json
from pathlib import Path


def longmemeval_file(path: Path) -> Path:
    """Two questions in the LongMemEval format; the second is an abstention question."""
    haystack = [
        [
            {"role": "user", "content": "I adopted a grey cat named Miso last week."},
            {"role": "assistant", "content": "Congratulations on adopting Miso!"},
            {"role": "user", "content": "She sleeps on the piano all day.", "has_answer": True},
        ],
        [
            {"role": "user", "content": "Can you suggest a pasta recipe with mushrooms?"},
            {"role": "assistant", "content": "Try a creamy mushroom tagliatelle."},
        ],
        [
            {"role": "user", "content": "My sister Lena moved to Lisbon in March."},
            {"role": "assistant", "content": "Lisbon is lovely in spring."},
        ],
    ]
    data = [
        {
            "question_id": "q1",
            "question_type": "single-session-user",
            "question": "Where does my cat sleep?",
            "question_date": "2023/05/30 (Tue) 10:18",
            "answer": "on the piano",
            "haystack_session_ids": ["s_pasta", "answer_cat", "s_lena"],
            "haystack_dates": ["2023/05/20 (Sat) 07:47", "2023/05/21 (Sun) 09:00",
                               "2023/05/22 (Mon) 12:30"],
            "haystack_sessions": [haystack[1], haystack[0], haystack[2]],
            "answer_session_ids": ["answer_cat"],
        },
        {
            "question_id": "q2_abs",
            "question_type": "single-session-user",
            "question": "What is my dog's name?",
            "question_date": "2023/06/01 (Thu) 08:00",
            "answer": "You did not mention a dog.",
            "haystack_session_ids": ["s_lena", "s_pasta"],
            "haystack_dates": ["2023/05/22 (Mon) 12:30", "2023/05/20 (Sat) 07:47"],
            "haystack_sessions": [haystack[2], haystack[1]],
            "answer_session_ids": [],
        },
    ]  # fmt: skip
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def locomo_file(path: Path) -> Path:
    """One conversation in the LoCoMo format, with a malformed evidence string."""
    data = [
        {
            "sample_id": "conv-x",
            "conversation": {
                "speaker_a": "Caroline",
                "speaker_b": "Melanie",
                "session_1_date_time": "1:56 pm on 8 May, 2023",
                "session_1": [
                    {"speaker": "Caroline", "dia_id": "D1:1", "text": "I went to a pottery class."},
                    {"speaker": "Melanie", "dia_id": "D1:2", "text": "What did you make?"},
                    {"speaker": "Caroline", "dia_id": "D1:3", "text": "A blue bowl.",
                     "blip_caption": "a photo of a blue ceramic bowl"},
                ],
                "session_2_date_time": "10:37 am on 27 June, 2023",
                "session_2": [
                    {"speaker": "Melanie", "dia_id": "D2:1", "text": "We camped by the lake."},
                    {"speaker": "Caroline", "dia_id": "D2:2", "text": "Did the kids swim?"},
                ],
            },
            "qa": [
                {"question": "What did Caroline make at pottery class?", "answer": "a bowl",
                 "evidence": ["D1:3"], "category": 1},
                {"question": "Where did Melanie camp?", "answer": "by the lake",
                 "evidence": ["D2:1; D1:1"], "category": 2},
                {"question": "What did Melanie paint?", "adversarial_answer": "a sunset",
                 "evidence": [], "category": 5},
            ],
        }
    ]  # fmt: skip
    path.write_text(json.dumps(data), encoding="utf-8")
    return path
