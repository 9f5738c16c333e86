"""The entry codecs: the checksummed format and each kind written in it (kernels, call records,
winners, memos, warm sets), the canonical encoding and the summary fields."""
