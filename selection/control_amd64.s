#include "textflag.h"

// func stringRun(s []byte) (k int, esc bool)
// Returns the index of the first byte of s that is '"', below 0x20, or a
// backslash that does not start a two-byte escape (\" \\ \/ \b \f \n \r
// \t), len(s) when there is none; the two-byte escapes on the way are
// skipped, esc reports whether there was one. len(s) must be at least 16
// (the last 16 bytes are read in one load that overlaps the ones before).
// 32 bytes a step, then 16, then the overlapping last 16 (SSE2).
TEXT ·stringRun(SB), NOSPLIT, $0-33
	MOVQ s_base+0(FP), SI
	MOVQ s_len+8(FP), CX
	MOVQ SI, DI
	LEAQ (SI)(CX*1), R9    // the end
	LEAQ -16(R9), DX       // the last 16 bytes
	LEAQ -32(R9), R8       // a 32-byte step must start at or before R8
	XORL R10, R10          // esc
	MOVQ $0x2222222222222222, AX
	MOVQ AX, X1
	PUNPCKLQDQ X1, X1
	MOVQ $0x5c5c5c5c5c5c5c5c, AX
	MOVQ AX, X2
	PUNPCKLQDQ X2, X2
	MOVQ $0x1f1f1f1f1f1f1f1f, AX
	MOVQ AX, X3
	PUNPCKLQDQ X3, X3
	PXOR X0, X0

loop32:
	CMPQ SI, R8
	JA   loop16
	MOVOU (SI), X4
	MOVOU 16(SI), X7
	MOVOU X4, X5
	MOVOU X4, X6
	MOVOU X7, X8
	MOVOU X7, X9
	PCMPEQB X1, X5
	PCMPEQB X2, X6
	PSUBUSB X3, X4
	PCMPEQB X0, X4
	PCMPEQB X1, X8
	PCMPEQB X2, X9
	PSUBUSB X3, X7
	PCMPEQB X0, X7
	POR X5, X4
	POR X6, X4
	POR X8, X7
	POR X9, X7
	PMOVMSKB X4, AX
	PMOVMSKB X7, BX
	SHLL $16, BX
	ORL BX, AX
	JNZ found
	ADDQ $32, SI
	JMP loop32

loop16:
	// SI > R8: at most one 16-byte step before the last load.
	CMPQ SI, DX
	JAE  last
	MOVOU (SI), X4
	MOVOU X4, X5
	MOVOU X4, X6
	PCMPEQB X1, X5
	PCMPEQB X2, X6
	PSUBUSB X3, X4
	PCMPEQB X0, X4
	POR X5, X4
	POR X6, X4
	PMOVMSKB X4, AX
	TESTL AX, AX
	JNZ found
	ADDQ $16, SI

last:
	// SI in [DX, DX+16): the bytes before SI were checked.
	MOVOU (DX), X4
	MOVOU X4, X5
	MOVOU X4, X6
	PCMPEQB X1, X5
	PCMPEQB X2, X6
	PSUBUSB X3, X4
	PCMPEQB X0, X4
	POR X5, X4
	POR X6, X4
	PMOVMSKB X4, AX
	MOVQ SI, CX
	SUBQ DX, CX // bytes of the last load already checked
	SHRL CX, AX
	TESTL AX, AX
	JZ none
	BSFL AX, AX
	ADDQ SI, AX
	JMP special

found:
	BSFL AX, AX
	ADDQ SI, AX

special:
	// AX points at the special byte.
	MOVBLZX (AX), BX
	CMPL BX, $0x5c
	JNE ret
	LEAQ 1(AX), CX
	CMPQ CX, R9
	JAE ret // a backslash at the end
	MOVBLZX (CX), BX
	CMPL BX, $0x22
	JEQ skip
	CMPL BX, $0x5c
	JEQ skip
	CMPL BX, $0x2f
	JEQ skip
	CMPL BX, $0x62
	JEQ skip
	CMPL BX, $0x66
	JEQ skip
	CMPL BX, $0x6e
	JEQ skip
	CMPL BX, $0x72
	JEQ skip
	CMPL BX, $0x74
	JEQ skip
	JMP ret

skip:
	MOVL $1, R10
	LEAQ 2(AX), SI
	CMPQ SI, R9
	JB loop32

none:
	MOVQ s_len+8(FP), AX
	MOVQ AX, k+24(FP)
	MOVB R10, esc+32(FP)
	RET

ret:
	SUBQ DI, AX
	MOVQ AX, k+24(FP)
	MOVB R10, esc+32(FP)
	RET
