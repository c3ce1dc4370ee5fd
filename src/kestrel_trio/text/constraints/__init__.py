"""What limits the tokens a generation may sample.

- Structured outputs: :mod:`.grammar` writes a request's JSON schema, regex, choice or grammar as an
  llguidance grammar (after :mod:`.schema_budget` has bounded the schema's cost), and :mod:`.constraint`
  binds it to the model's tokenizer and yields each step's token mask.
- :mod:`.reasoning_budget`: the end-of-reasoning token forced once a reasoning block has used its tokens.

The generation state machine (:mod:`kestrel_trio.text.generation`) consults both before each sample.
"""
