"""The official sampler's prompt text: the FPS and motion-score suffixes (`add_prompt_suffixes`,
as the official add_fps_info_to_text and add_motion_score_to_text make it)."""

from sagevideo.pipelines.opensora.prompts import add_prompt_suffixes


def test_prompt_text_of_the_official_sampler():
    assert add_prompt_suffixes("a cat playing piano", 24, 4) == "a cat playing piano. 24 FPS. 4 motion score."
    assert add_prompt_suffixes("  a cat.\n", 24, 4) == "a cat. 24 FPS. 4 motion score."  # stripped, one period
    assert add_prompt_suffixes("a cat at 30 FPS.", 24, 4) == "a cat at 30 FPS. 4 motion score."  # FPS given
    assert add_prompt_suffixes("a cat at 30 FPS", 24, 4) == "a cat at 30 FPS. 4 motion score."  # period first
    assert add_prompt_suffixes("a cat, FPS.", 24, 4) == "a cat, FPS. 24 FPS. 4 motion score."  # no number
    assert add_prompt_suffixes("a cat", 24, None) == "a cat. 24 FPS."
    assert add_prompt_suffixes("a cat", None, None) == "a cat"
