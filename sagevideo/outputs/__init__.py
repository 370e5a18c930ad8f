"""Generation outputs: mp4 files written atomically (`video`), staging, folders, and the JSON-lines
manifest of typed, versioned `ManifestRecord`s (`manifest`)."""
