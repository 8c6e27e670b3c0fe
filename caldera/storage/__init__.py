"""Storage spaces: a user's personal space (the workspace jobs run in), each account's shared space and the public
space, with quotas kept by counters, reached by the API, the CLI, WebDAV and job mounts.

Every path a user gives goes through ``paths.parts`` and then ``tree.Tree``, which opens it one component at a
time under the space's root without following a symbolic link: nothing a job planted inside a space leads the
server out of it.
"""
