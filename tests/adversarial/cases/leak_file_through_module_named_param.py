"""Leak: a file read into the verdict through untyped_storage().from_file, on a parameter named math.

Family: reference leakage. Reading any file the runner can see (UntypedStorage.from_file through a
`math`-named parameter) and putting its bytes into the verdict's reason with a raise message.
"""


from coda_agent.primitives import epilogue


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def storage(math):
    return math.untyped_storage()


def from_file(math, path, nbytes):
    return math.from_file(path, False, nbytes)


def tolist(math):
    return math.tolist()


def forward(x, w, residual):
    data = tolist(from_file(storage(x), "/etc/hostname", 64))
    raise ValueError("leak: " + str(data))
