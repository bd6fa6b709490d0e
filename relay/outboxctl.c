/* outboxctl - placeholder main until the admin CLI lands. */
#include <stdio.h>

int
main(void)
{
    fputs("outboxctl: not built yet\n", stderr);
    return 1;
}
