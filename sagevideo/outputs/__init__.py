"""Generation outputs: mp4 files written atomically (`video`) and the JSON-lines manifest (`manifest`)."""
