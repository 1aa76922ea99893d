"""The repository checker's rules, one module each; `utils/check_masks.py` is the entry point that runs them.

common.py         Problem, parsed modules (Loader), AST helpers shared by the rules
copies.py         copies: `# Copied from` blocks equal their sources after renames (and `--fix` rewrites them)
mask_contract.py  attention-signature, markers, no-mask-in-models: what model files must and must not do
registration.py   registration, tests: every architecture is in the auto mappings and has a parity test class
"""
