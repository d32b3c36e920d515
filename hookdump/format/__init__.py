"""What every layer shares, one module per concept: `keys` (tensor keys and where they came
from), `dtypes` (the dtypes a dump holds), `rows` (a batch's rows, the samples and ids they
come from), `manifest` (the dump's names and the one check every manifest read from disk
goes through), `values` (sizes and whole numbers). No torch at import time: the CLI's
`--help` imports these.
"""
