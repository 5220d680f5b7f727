"""One module per verb, named after it. Each holds the stage function that opens the verb's
run record, calls the engines beneath and returns its result. A step never calls another
step, except `run`, which is their composition in protocol order."""
