"""The HunyuanVideo 1.5 family: `family` (registered in `sagevideo.pipelines.families`) tells
`install` which of its layers' masks are key padding."""
