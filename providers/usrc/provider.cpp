// The provider library is the verbs glue (usrc_glue), linked whole.
