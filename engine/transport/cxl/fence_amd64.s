#include "textflag.h"

// func fence()
TEXT ·fence(SB), NOSPLIT, $0-0
	MFENCE
	RET

// func flushLines(p, n uintptr)
TEXT ·flushLines(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), AX
	MOVQ n+8(FP), CX
loop:
	TESTQ CX, CX
	JZ   done
	CLFLUSHOPT (AX)
	ADDQ $64, AX
	DECQ CX
	JMP  loop
done:
	SFENCE
	RET
