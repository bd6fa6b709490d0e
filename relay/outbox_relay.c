/* outbox-relay - placeholder main until the daemon lands. */
#include <stdio.h>

int
main(void)
{
    fputs("outbox-relay: not built yet\n", stderr);
    return 1;
}
