"""The command lines: pepsi-dispatch, pepsi-queue, their shared shell, logging and man pages."""
