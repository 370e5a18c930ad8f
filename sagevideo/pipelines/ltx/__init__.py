"""The LTX family (LTX-Video and LTX-2): `family` (registered in `sagevideo.pipelines.families`) tells
`install` which of its layers' masks are key padding."""
